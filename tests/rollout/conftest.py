from collections.abc import Callable, Iterator

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def chain_weights(original: dict[str, torch.Tensor], chain: list[int], scale: float = 5.0) -> dict[str, torch.Tensor]:
    """Hand-set weights that make the tiny model a bigram machine: after ``chain[k]`` it emits ``chain[k + 1]``.

    Zero attention and MLP output projections leave the residual stream at the current token's embedding; the chain
    tokens get orthonormal embeddings e_k (after the final RMSNorm, sqrt(hidden) * e_k), and the LM head row of
    ``chain[k + 1]`` is ``scale * e_k``: a logit of 40 against 0 for every other token, so sampling (any
    temperature <= 1) follows the chain with probability 1 - vocab * e^-40.
    """
    if len(set(chain)) != len(chain):
        raise ValueError(f"chain={chain}: a bigram machine needs distinct tokens")
    weights = {k: v.clone() for k, v in original.items()}
    hidden = weights["model.embed_tokens.weight"].shape[1]
    if len(chain) > hidden:
        raise ValueError(f"chain of {len(chain)} tokens: at most hidden_size={hidden}")
    for name, w in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w.zero_()
    weights["model.norm.weight"].fill_(1.0)
    weights["lm_head.weight"].zero_()
    basis = torch.eye(hidden)
    for k, token in enumerate(chain):
        weights["model.embed_tokens.weight"][token] = basis[k]
        if k + 1 < len(chain):
            weights["lm_head.weight"][chain[k + 1]] = scale * basis[k]
    return weights


@pytest.fixture
def load_chain(engine, tiny_model_dir) -> Iterator[Callable[[list[int]], None]]:
    """``load_chain(chain)`` puts :func:`chain_weights` into the engine; the random weights come back after the
    test."""
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    yield lambda chain: engine.update_weights(chain_weights(original, chain).items())
    engine.update_weights(original.items())


@pytest.fixture(scope="session")
def ids(tokenizer) -> Callable[..., list[int]]:
    """``ids("<action>", "go")``: one token id per piece (each piece must be one env-bpe token)."""

    def ids(*pieces: str) -> list[int]:
        out = []
        for piece in pieces:
            (token,) = tokenizer.encode(piece, add_special_tokens=False)
            out.append(token)
        return out

    return ids


@pytest.fixture(scope="session")
def teacher(tiny_model_dir, tokenizer):
    """UOPD's teacher: its own engine beside the student's, whose hand-set bigram weights (:func:`chain_weights`)
    answer every chat prompt with ``<action>look</action>``, and a scorer of the tiny random model."""
    from actfirst.core.config import EngineConfig, SchedulerConfig
    from actfirst.engine.core import ActFirstEngine
    from actfirst.train.teacher import TeacherScorer

    cfg = EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=2048, max_num_seqs=16,
                       max_num_batched_tokens=4096, kv_cache_gib=1)
    engine = ActFirstEngine.from_config(cfg, SchedulerConfig(b_max=8))
    prompt_end = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)[-1]
    chain = [prompt_end, *tokenizer.encode("<action>look</action>", add_special_tokens=False),
             tokenizer.convert_tokens_to_ids("<|im_end|>")]
    engine.update_weights(chain_weights(load_file(f"{tiny_model_dir}/model.safetensors"), chain).items())
    return engine, TeacherScorer.load(tiny_model_dir, student_tokenizer=tiny_model_dir)
