"""Offline ALFRED-style ALFWorld games (``games: generated``: tests and demos, not the paper's json_2.1.1 games).

A game is what ALFWorld itself plays: a ``game.tw-pddl`` JSON holding the ALFRED PDDL domain, the text grammar with
the task description filled in, and a PDDL problem; next to it a ``traj_data.json`` with ``task_type`` and
``pddl_params`` (what ALFWorld's hand-coded expert reads). Everything comes from the alfworld package: the domain
(``data/alfred.pddl``), the grammar (``data/alfred.twl2``), the floor plans' receptacles with their nearest
navigation points (``gen/layouts/FloorPlan*-openable.json``) and object types (``*-objects.json``), the
object/receptacle compatibility and object affordances (``gen/constants.py``), and the goal formulas and description
templates (``gen/goal_library.py``). A generated game is kept only when the planner (Fast Downward, through
TextWorld) finds a plan; the plan is stored as the game's walkthrough. Generation is deterministic for a seed.
The command ``python -m actfirst.envs.alfworld.generate`` writes games to a folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

from actfirst.envs.alfworld.env import SPLITS, ALFWorldTask, ALFWorldTextEnv, alfworld_tasks

# The six ALFWorld task types (Appendix C.1), short name -> ALFRED name.
TASK_TYPES = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick2": "pick_two_obj_and_place",
}
_STATE_CHANGE = {"clean": ("Cleanable", "SinkBasin"), "heat": ("Heatable", "Microwave"), "cool": ("Coolable", "Fridge")}
_STEP = 0.25  # ALFRED's grid step (constants.AGENT_STEP_SIZE): a location is loc|x|z|rotation|horizon in steps
_LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser", "Shelf")
_MAX_TRIES = 50


def _alfworld_dir() -> Path:
    import alfworld

    return Path(alfworld.__file__).parent


def _pddl_name(text: str) -> str:
    """ALFRED's identifier mangling (PlannedGameState.fix_pddl_str_chars), one pass, char by char."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


@dataclasses.dataclass(frozen=True, slots=True)
class GameSpec:
    """What a generated game asks: the task type and its ALFRED pddl_params."""

    task_type: str
    floor_plan: int
    object_target: str
    parent_target: str
    toggle_target: str
    description: str


class _Scene:
    """A floor plan's static receptacles (with navigation points) and the object types that may appear in it."""

    def __init__(self, floor_plan: int):
        from alfworld.gen import constants

        layouts = _alfworld_dir() / "gen" / "layouts"
        points = json.loads((layouts / f"FloorPlan{floor_plan}-openable.json").read_text())
        self.floor_plan = floor_plan
        self.receptacles: dict[str, tuple[str, str]] = {}  # id -> (type, location)
        for rid, (x, z, rotation, horizon) in sorted(points.items()):
            rtype = rid.split("|")[0]
            if rtype in ("Sink", "Bathtub"):  # ALFRED's basins: "Sink|...|SinkBasin" renders as "sinkbasin 1"
                rtype += "Basin"
                rid = f"{rid}|{rtype}"
            loc = f"loc|{round(x / _STEP)}|{round(z / _STEP)}|{round(rotation / 90) % 4}|{int(horizon)}"
            self.receptacles[rid] = (rtype, loc)
        self.receptacle_types = sorted({t for t, _ in self.receptacles.values()})
        self.can_contain = {r: sorted(constants.VAL_RECEPTACLE_OBJECTS.get(r, ())) for r in self.receptacle_types}
        scene_objects = json.loads((layouts / f"FloorPlan{floor_plan}-objects.json").read_text())
        self.object_types = sorted(o for o in scene_objects
                                   if o in constants.OBJECTS and any(o in v for v in self.can_contain.values()))
        self.lamp_receptacles = [rid for rid, (t, _) in self.receptacles.items() if t in _LAMP_RECEPTACLES]
        self.has_lamp = "DeskLamp" in scene_objects and bool(self.lamp_receptacles)

    def holders(self, otype: str) -> list[str]:
        return [rid for rid, (t, _) in self.receptacles.items() if otype in self.can_contain[t]]


def floor_plans() -> list[int]:
    """Every floor plan the alfworld package ships layouts for."""
    layouts = _alfworld_dir() / "gen" / "layouts"
    return sorted(int(p.name[len("FloorPlan"):].split("-")[0]) for p in layouts.glob("FloorPlan*-openable.json"))


def unseen_floor_plan(floor_plan: int) -> bool:
    """Held-out rooms (one in ten of each room type) for the generated valid_unseen split, as ALFWorld's unseen
    split uses rooms never seen in training."""
    return floor_plan % 10 == 5


def _choose_spec(rng: random.Random, task: str, unseen: bool) -> tuple[_Scene, GameSpec] | None:
    from alfworld.gen import constants, goal_library

    alfred_type = TASK_TYPES[task]
    rooms = constants.GOALS_VALID[alfred_type]
    plans = [p for p in floor_plans() if any(p in constants.SCENE_TYPE[r] for r in rooms)
             and unseen_floor_plan(p) == unseen]
    scene = _Scene(rng.choice(plans))
    objects = scene.object_types
    if task in _STATE_CHANGE:
        affordance, tool = _STATE_CHANGE[task]
        if tool not in scene.receptacle_types:
            return None
        objects = [o for o in objects if o in constants.VAL_ACTION_OBJECTS[affordance]]
    if task == "look" and not scene.has_lamp:
        return None
    if not objects:
        return None
    obj = rng.choice(objects)
    parents = [r for r in scene.receptacle_types if obj in scene.can_contain[r]]
    if task == "look":
        parent = ""
    elif len(parents) < 2:  # the object must start somewhere other than the goal receptacle type
        return None
    else:
        parent = rng.choice(parents)
    toggle = "DeskLamp" if task == "look" else ""
    template = rng.choice(goal_library.gdict[alfred_type]["templates"])
    description = template.format(obj=obj.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    return scene, GameSpec(alfred_type, scene.floor_plan, obj, parent, toggle, description)


def _coordinate(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))


def _instances(rng: random.Random, scene: _Scene, spec: GameSpec) -> list[tuple[str, str, str]]:
    """(id, type, receptacle id) of every object instance: the scene's object types, 1-3 instances each (2-3 of a
    pick-two target), in receptacles that can hold them but never of the goal receptacle's type."""
    from alfworld.gen import constants

    instances = []
    for otype in scene.object_types:
        holders = [rid for rid in scene.holders(otype) if scene.receptacles[rid][0] != spec.parent_target]
        if not holders:
            continue
        low = 2 if (otype == spec.object_target and spec.task_type == TASK_TYPES["pick2"]) else 1
        count = rng.randint(low, max(low, constants.MAX_NUM_OF_OBJ_INSTANCES))
        instances += [(f"{otype}|{_coordinate(rng)}", otype, rng.choice(holders)) for _ in range(count)]
    if spec.toggle_target:
        instances.append((f"DeskLamp|{_coordinate(rng)}", "DeskLamp", rng.choice(scene.lamp_receptacles)))
    if not any(t == spec.object_target for _, t, _ in instances):
        raise ValueError("target object has no holder")
    return instances


def _problem(scene: _Scene, spec: GameSpec, instances: list[tuple[str, str, str]], start: str) -> str:
    """The PDDL problem: every receptacle, the object instances, affordances, the agent at ``start``, the goal."""
    from alfworld.gen import constants, goal_library

    locations = sorted({loc for _, loc in scene.receptacles.values()})
    otypes = sorted({t for _, t, _ in instances})
    affordance = {name: constants.VAL_ACTION_OBJECTS[key] for name, key in
                  (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                   ("toggleable", "Toggleable"), ("sliceable", "Sliceable"))}

    decls = ["agent1 - agent"]
    decls += [f"{_pddl_name(location)} - location" for location in [start] + locations]
    decls += [f"{_pddl_name(r)} - receptacle" for r in scene.receptacles]
    decls += [f"{_pddl_name(o)} - object" for o, _, _ in instances]
    decls += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in scene.receptacle_types]
    init = [f"(atLocation agent1 {_pddl_name(start)})"]
    for rid, (rtype, loc) in scene.receptacles.items():
        init += [f"(receptacleType {_pddl_name(rid)} {rtype}Type)", f"(receptacleAtLocation {_pddl_name(rid)} "
                                                                     f"{_pddl_name(loc)})"]
        if rtype in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {_pddl_name(rid)})")
    for rtype in scene.receptacle_types:
        init += [f"(canContain {rtype}Type {otype}Type)" for otype in otypes if otype in scene.can_contain[rtype]]
    for oid, otype, rid in instances:
        name = _pddl_name(oid)
        init += [f"(objectType {name} {otype}Type)", f"(inReceptacle {name} {_pddl_name(rid)})",
                 f"(objectAtLocation {name} {_pddl_name(scene.receptacles[rid][1])})"]
        if otype != "DeskLamp":
            init.append(f"(pickupable {name})")
        init += [f"({pred} {name})" for pred, types in affordance.items() if otype in types]
    goal = goal_library.gdict[spec.task_type]["pddl"].format(obj=spec.object_target, recep=spec.parent_target,
                                                            toggle=spec.toggle_target, mrecep="")
    goal = goal.replace("#", "-")
    return ("(define (problem plan_generated)\n(:domain alfred)\n(:objects\n" + "\n".join(decls) + "\n)\n(:init\n"
            + "\n".join(init) + "\n)\n" + goal.strip() + "\n")


def _start_location(rng: random.Random, scene: _Scene) -> str:
    taken = {loc for _, loc in scene.receptacles.values()}
    while True:
        start = f"loc|{rng.randint(-20, 20)}|{rng.randint(-20, 20)}|{rng.randint(0, 3)}|30"
        if start not in taken:
            return start


def replay_wins(game_file: str | Path, commands: list[str]) -> bool:
    """Whether ``commands`` win ``game_file`` when played as the ALFWorld environment plays it."""
    env = ALFWorldTextEnv(max_turns=len(commands) + 1)
    try:
        env.reset(ALFWorldTask(str(game_file), task_type=""))
        for command in commands:
            transition = env.step(command)
            if transition.done:
                return transition.won
        return False
    finally:
        env.close()


def plan(game_file: str | Path) -> list[str]:
    """The planner's command sequence from the start of ``game_file`` (empty when there is none)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    env = AlfredDemangler(PddlEnv(textworld.EnvInfos(policy_commands=True)))
    try:
        env.load(str(game_file))
        return list(env.reset()["policy_commands"] or [])
    except Exception:  # the planner reports an unsolvable problem through assorted errors (e.g. KeyError 'val1')
        return []
    finally:
        env.close()


def generate_game(seed: int, task: str, out_dir: str | Path, unseen: bool = False) -> Path:
    """Write one solvable game of ``task`` (a key of ``TASK_TYPES``) under ``out_dir``; returns the game file.

    Deterministic for ``(seed, task, unseen)``: candidates are drawn from ``random.Random(f"{seed}-{task}")`` until
    the planner solves one and its plan wins the game (at most 50 tries). ``unseen`` draws from the held-out rooms.
    """
    if task not in TASK_TYPES:
        raise ValueError(f"task={task!r}: not one of {sorted(TASK_TYPES)}")
    alfworld_data = _alfworld_dir() / "data"
    domain = (alfworld_data / "alfred.pddl").read_text()
    grammar = (alfworld_data / "alfred.twl2").read_text()
    rng = random.Random(f"{seed}-{task}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(_MAX_TRIES):
        chosen = _choose_spec(rng, task, unseen)
        if chosen is None:
            continue
        scene, spec = chosen
        try:
            instances = _instances(rng, scene, spec)
        except ValueError:
            continue
        start = _start_location(rng, scene)
        # Plan on the problem reduced to the objects the goal names (other objects never interact with them: the
        # domain has no capacity limits), then check the plan wins the full game: Fast Downward grounds a full
        # kitchen in about 15 s, the reduced problem in well under one.
        relevant = [i for i in instances if i[1] in (spec.object_target, spec.toggle_target)]
        game = {"pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", spec.description),
                "pddl_problem": _problem(scene, spec, relevant, start), "solvable": None, "walkthrough": None}
        game_file = out_dir / "game.tw-pddl"
        tmp = game_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(game))
        walkthrough = plan(tmp)
        game["pddl_problem"] = _problem(scene, spec, instances, start)
        tmp.write_text(json.dumps(game))
        if not walkthrough or not replay_wins(tmp, walkthrough):
            continue
        game.update(solvable=True, walkthrough=walkthrough)
        traj = {"task_type": spec.task_type, "scene": {"floor_plan": f"FloorPlan{spec.floor_plan}"},
                "pddl_params": {"object_target": spec.object_target, "parent_target": spec.parent_target,
                                "toggle_target": spec.toggle_target, "mrecep_target": "", "object_sliced": False},
                "generated": {"seed": seed, "task": task, "description": spec.description}}
        tmp.write_text(json.dumps(game))
        (out_dir / "traj_data.json").write_text(json.dumps(traj, indent=1))
        os.replace(tmp, game_file)
        return game_file
    raise RuntimeError(f"seed={seed}, task={task!r}: no solvable game in {_MAX_TRIES} tries")


def generate_split(out_dir: str | Path, per_type: int, seed: int = 0, unseen: bool = False) -> list[Path]:
    """``per_type`` games of each of the six task types under ``out_dir/<task>-<i>/``; existing games are kept."""
    files = []
    for task in TASK_TYPES:
        for i in range(per_type):
            game_dir = Path(out_dir) / f"{task}-{i:04d}"
            game_file = game_dir / "game.tw-pddl"
            files.append(game_file if game_file.exists()
                         else generate_game(seed * 1_000_003 + i, task, game_dir, unseen))
    return files


def missing_games(out_dir: str | Path, per_type: int) -> int:
    """How many of :func:`generate_split`'s games are not yet under ``out_dir``."""
    return sum(not (Path(out_dir) / f"{task}-{i:04d}" / "game.tw-pddl").exists()
               for task in TASK_TYPES for i in range(per_type))


def generated_split(split: str, generated_dir: str | Path, per_type: int = 10,
                    seed: int = 0) -> list[ALFWorldTask]:
    """The generated games of ``split`` under ``generated_dir/<split>``: ``per_type`` of each task type, generated
    where missing (distinct seeds per split; valid_unseen in rooms the other splits never use)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: not one of {SPLITS}")
    generate_split(Path(generated_dir) / split, per_type, seed=seed * len(SPLITS) + SPLITS.index(split),
                   unseen=split == "valid_unseen")
    return alfworld_tasks(Path(generated_dir) / split)
