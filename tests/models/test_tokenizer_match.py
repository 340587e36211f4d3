"""The student-teacher tokenizer check compares ids, not text: a teacher whose chat template was re-saved in
another form but renders the same ids is accepted; one that maps anything to other ids is refused, naming both
models (B.4: the teacher scores the student's exact token ids)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actfirst.core.config import ConfigError
from actfirst.models.tokenizers import CHAT_TEMPLATE, check_tokenizers_match, train_env_bpe_tokenizer

REFORMATTED = "\n".join([  # every tag trims the whitespace around it: the same rendering
    "{%- for message in messages %}",
    "    {{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}",
    "    {{- '<|im_start|>assistant\\n' }}",
    "{%- endif %}",
])
SYSTEM_ADDED = "{{- '<|im_start|>system\\nBe brief.<|im_end|>\\n' -}}" + CHAT_TEMPLATE
THINKING_OFF_BLOCK = CHAT_TEMPLATE + "{%- if add_generation_prompt and enable_thinking is defined and not " \
                                     "enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"


def copy_with_template(src: Path, dst: Path, template: str, *, legacy: bool) -> Path:
    """A copy of model ``src`` whose chat template is ``template``: re-saved by transformers
    (``chat_template.jinja``), or (``legacy``) as a ``tokenizer_config.json`` entry, as older versions saved it."""
    shutil.copytree(src, dst)
    if legacy:
        (dst / "chat_template.jinja").unlink(missing_ok=True)
        config = json.loads((dst / "tokenizer_config.json").read_text())
        (dst / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}, indent=2))
    else:
        tokenizer = AutoTokenizer.from_pretrained(src)
        tokenizer.chat_template = template
        tokenizer.save_pretrained(dst)
    return dst


@pytest.mark.parametrize("legacy", [False, True], ids=["resaved", "in-tokenizer-config"])
def test_a_template_resaved_in_another_form_that_renders_the_same_ids_is_accepted(tiny_model_dir, tmp_path, legacy):
    teacher = copy_with_template(tiny_model_dir, tmp_path / "teacher", REFORMATTED, legacy=legacy)
    assert AutoTokenizer.from_pretrained(teacher).chat_template == REFORMATTED != CHAT_TEMPLATE
    check_tokenizers_match(tiny_model_dir, teacher)


@pytest.mark.parametrize("template,what", [(SYSTEM_ADDED, "4 of 4 probe conversations"),
                                           (THINKING_OFF_BLOCK, "2 of 4 probe conversations")],
                         ids=["system-prompt", "thinking-off-block"])
def test_a_template_that_renders_other_ids_is_refused_naming_both(tiny_model_dir, tmp_path, template, what):
    teacher = copy_with_template(tiny_model_dir, tmp_path / "teacher", template, legacy=False)
    with pytest.raises(ConfigError) as err:
        check_tokenizers_match(tiny_model_dir, teacher)
    message = str(err.value)
    assert message.startswith(f"teacher={str(teacher)!r}: its tokenizer differs from the student's "
                              f"(student.model={str(tiny_model_dir)!r}): the chat template's ids for {what}"), message
    assert "vocab" not in message


def test_a_tokenizer_that_maps_text_to_other_ids_is_refused_naming_both(tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    train_env_bpe_tokenizer(["go north, open the door, take the apple"] * 50, vocab_size=400).save_pretrained(teacher)
    with pytest.raises(ConfigError) as err:
        check_tokenizers_match(tiny_model_dir, teacher)
    message = str(err.value)
    assert message.startswith(f"teacher={str(teacher)!r}: its tokenizer differs from the student's "
                              f"(student.model={str(tiny_model_dir)!r}): vocab ("), message
    assert "probe texts, first 'You are in the kitchen." in message and "probe conversations" in message


def test_another_eos_is_refused(tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.save_pretrained(teacher)
    with pytest.raises(ConfigError, match=r"\): eos_token_id \d+ vs \d+"):
        check_tokenizers_match(tiny_model_dir, teacher)
