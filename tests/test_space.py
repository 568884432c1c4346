"""Config spaces: the shipped matmul.toml, enumeration, constraints, hashing and bad files."""

from __future__ import annotations

import dataclasses
import math
import pickle
import textwrap
from pathlib import Path

import optuna
import pytest

import tunesvc
from tunesvc import Space
from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.space import Expression
from tunesvc.template import SHIPPED

PROBLEM_VARS = ("M", "N", "K", "elem_bytes")


def problem_env(M, N, K, elem_bytes=2):
    return {"M": M, "N": N, "K": K, "elem_bytes": elem_bytes}


# -- the shipped space ---------------------------------------------------------------------
def test_matmul_space_loads_from_search_spaces(template):
    space = template.space
    assert Path(space.source).name == "matmul.toml"
    assert Path(space.source).parent.name == "search_spaces"
    assert space.names == [
        *("VARIANT", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "FLATTEN", "SUBTILE"),
        *("num_warps", "num_stages"),
    ]
    assert space.parameters["VARIANT"].choices == ("grouped", "persistent", "tma", "splitk", "splittail")
    assert space.parameters["BLOCK_M"].choices == (16, 32, 64, 128, 256)
    assert space.parameters["GROUP_M"].choices == (1, 8)
    assert space.parameters["num_warps"].is_launch_option
    assert not space.parameters["BLOCK_M"].is_launch_option
    assert {"shared_memory", "accumulator", "tile_m", "tile_n", "tile_k", "group"} <= set(space.constraints)


def test_pow2_ranges_expand_to_every_power_of_two(template):
    space = template.space
    assert space.parameters["BLOCK_N"].choices == (32, 64, 128, 256)
    assert space.parameters["BLOCK_K"].choices == (32, 64, 128)


def test_pow2_single_value_and_from_one(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[params]\nA = { pow2 = [1, 8] }\nB = { pow2 = [16, 16] }\n")
    space = Space.from_toml(path)
    assert space.parameters["A"].choices == (1, 2, 4, 8)
    assert space.parameters["B"].choices == (16,)


def test_enumerate_size_is_product_of_choices(template):
    space = template.space
    expected = math.prod(len(p.choices) for p in space.parameters.values())
    assert expected == 5 * 5 * 4 * 3 * 2 * 5 * 2 * 2 * 2 * 5  # SPLIT_K: 1, 2, 3, 4, 8; FLATTEN, SUBTILE: 0, 1
    configs = space.enumerate()
    assert space.size == expected == len(configs)
    assert len({config_hash(c) for c in configs}) == expected  # no duplicates
    assert all(list(c) == space.names for c in configs)


def test_feasible_respects_constraints_for_small_m(template, device):
    space = template.space
    feasible = space.feasible(problem_env(16, 45, 29), device.limits())
    assert feasible
    assert {c["BLOCK_M"] for c in feasible} == {16}
    # N=45 -> next_pow2 64; K=29 -> 32
    assert {c["BLOCK_N"] for c in feasible} == {32, 64}
    assert {c["BLOCK_K"] for c in feasible} == {32}
    # a single tile-row: grouping is pointless and pruned
    assert {c["GROUP_M"] for c in feasible} == {1}
    for c in feasible:
        assert space.violations(c, problem_env(16, 45, 29), device.limits()) == []
    assert len(feasible) < space.size


def test_violations_name_the_broken_constraints(template, device):
    space = template.space
    config = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 5}
    broken = space.violations(config, problem_env(16, 16, 16), device.limits())
    assert {"accumulator", "tile_m", "tile_n", "tile_k", "group"} <= set(broken)
    # shared memory: (256 + 256) * 128 * 2 * 5 = 655360 bytes
    small = space.violations(config, problem_env(4096, 4096, 4096), {**device.limits(), "max_shared_memory": 100_000})
    assert "shared_memory" in small
    roomy = space.violations(config, problem_env(4096, 4096, 4096), {**device.limits(), "max_shared_memory": 1 << 20})
    assert "shared_memory" not in roomy


def test_feasible_grows_with_the_problem(template, device):
    space = template.space
    small = space.feasible(problem_env(16, 32, 32), device.limits())
    large = space.feasible(problem_env(4096, 4096, 4096), device.limits())
    assert len(small) < len(large)
    assert {c["BLOCK_M"] for c in large} == {16, 32, 64, 128, 256}


def test_feasible_is_kept_per_problem_and_device_and_handed_out_as_copies(template, device):
    space = Space.from_toml(template.space_path, problem_vars=tuple(template.problem_vars_names()))  # a cold cache
    env, limits = problem_env(37, 45, 29), device.limits()
    first = space.feasible(env, limits)
    assert first == [c for c in space.enumerate() if not space.violations(c, env, limits)]
    first[0]["BLOCK_M"] = -1  # a caller may change what it gets
    first.clear()
    again = space.feasible(env, limits)
    assert again == [c for c in space.enumerate() if not space.violations(c, env, limits)]
    small_smem = {**limits, "max_shared_memory": 8192}  # another device: its own list
    assert space.feasible(env, small_smem) == [c for c in space.enumerate() if not space.violations(c, env, small_smem)]
    assert len(space.feasible(env, small_smem)) < len(again)


# -- config hashes ---------------------------------------------------------------------------
def test_config_hash_is_order_independent():
    a = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}
    b = {"num_warps": 4, "BLOCK_N": 32, "BLOCK_M": 16}
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16
    int(config_hash(a), 16)


def test_config_hash_differs_for_different_configs():
    base = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}
    hashes = {
        config_hash(base),
        config_hash({**base, "BLOCK_M": 32}),
        config_hash({**base, "num_warps": 8}),
        config_hash({"BLOCK_M": 16, "BLOCK_N": 32}),
        config_hash({"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4}),  # values swapped between names
    }
    assert len(hashes) == 5


# -- Optuna ----------------------------------------------------------------------------------
def test_suggest_with_a_real_optuna_trial(template):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = template.space
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(5):
        trial = study.ask()
        config = space.suggest(trial)
        space.validate(config)  # raises if a name or value is outside the space
        assert list(config) == space.names
        seen.add(config_hash(config))
        study.tell(trial, 1.0)
    assert len(seen) > 1
    assert set(space.distributions()) == set(space.names)


# -- validate ----------------------------------------------------------------------------------
def test_validate_accepts_a_config_of_the_space(template):
    template.space.validate(template.space.enumerate()[7])


def test_validate_rejects_an_unknown_parameter(template):
    config = {**template.space.enumerate()[0], "BLOCK_Z": 16}
    with pytest.raises(TunesvcError, match="Unknown parameter 'BLOCK_Z'"):
        template.space.validate(config)


def test_validate_rejects_a_value_outside_the_space(template):
    config = {**template.space.enumerate()[0], "BLOCK_M": 48}
    with pytest.raises(TunesvcError, match="BLOCK_M=48 is outside the space"):
        template.space.validate(config)


def test_validate_rejects_a_missing_parameter(template):
    config = dict(template.space.enumerate()[0])
    del config["num_stages"]
    with pytest.raises(TunesvcError, match="num_stages"):
        template.space.validate(config)


# -- bad files ---------------------------------------------------------------------------------
GOOD_PARAMS = """
[params]
BLOCK_M = [16, 32]
BLOCK_K = { pow2 = [16, 64] }
"""

BAD_FILES = {
    "toml_syntax": ("[params]\nBLOCK_M = [16, 32\n", None),
    "unknown_section": (GOOD_PARAMS + "\n[tuning]\nx = 1\n", "tuning"),
    "empty_choices": ("[params]\nBLOCK_M = []\n", "params.BLOCK_M"),
    "float_choice": ("[params]\nBLOCK_M = [16, 32.5]\n", "params.BLOCK_M"),
    "string_choice": ('[params]\nBLOCK_M = [16, "32"]\n', "params.BLOCK_M"),
    "bool_choice": ("[params]\nBLOCK_M = [true]\n", "params.BLOCK_M"),
    "duplicate_choice": ("[params]\nBLOCK_M = [16, 16]\n", "params.BLOCK_M"),
    "scalar_choice": ("[params]\nBLOCK_M = 16\n", "params.BLOCK_M"),
    "pow2_not_power": ("[params]\nBLOCK_K = { pow2 = [24, 64] }\n", "params.BLOCK_K"),
    "pow2_reversed": ("[params]\nBLOCK_K = { pow2 = [64, 16] }\n", "params.BLOCK_K"),
    "pow2_three_bounds": ("[params]\nBLOCK_K = { pow2 = [16, 32, 64] }\n", "params.BLOCK_K"),
    "pow2_zero": ("[params]\nBLOCK_K = { pow2 = [0, 64] }\n", "params.BLOCK_K"),
    "no_params": ("[constraints]\n", "params"),
    "unknown_name": (GOOD_PARAMS + '\n[constraints]\nsmem = "BLOCK_M * BLOCK_Q <= 4096"\n', "constraints.smem"),
    "import_call": (
        GOOD_PARAMS + "\n[constraints]\nsmem = \"__import__('os').system('touch pwned')\"\n",
        "constraints.smem",
    ),
    "attribute": (GOOD_PARAMS + '\n[constraints]\nsmem = "BLOCK_M.bit_length() < 8"\n', "constraints.smem"),
    "dunder_attribute": (GOOD_PARAMS + '\n[constraints]\nsmem = "(1).__class__ == 1"\n', "constraints.smem"),
    "unknown_function": (GOOD_PARAMS + '\n[constraints]\nsmem = "open(BLOCK_M)"\n', "constraints.smem"),
    "keyword_argument": (GOOD_PARAMS + '\n[constraints]\nsmem = "max(BLOCK_M, default=1) > 0"\n', "constraints.smem"),
    "lambda": (GOOD_PARAMS + '\n[constraints]\nsmem = "(lambda: 1)() == 1"\n', "constraints.smem"),
    "subscript": (GOOD_PARAMS + '\n[constraints]\nsmem = "[BLOCK_M][0] > 1"\n', "constraints.smem"),
    "string_literal": (GOOD_PARAMS + "\n[constraints]\nsmem = \"BLOCK_M == 'x'\"\n", "constraints.smem"),
    "expression_syntax": (GOOD_PARAMS + '\n[constraints]\nsmem = "BLOCK_M <="\n', "constraints.smem"),
    "non_string_constraint": (GOOD_PARAMS + "\n[constraints]\nsmem = 3\n", "constraints.smem"),
    "launch_option_in_params": ("[params]\nBLOCK_M = [16]\nnum_warps = [4, 8]\n", "params.num_warps"),
    "unknown_launch_option": (GOOD_PARAMS + "\n[launch]\nnum_threads = [4]\n", "launch.num_threads"),
    "subtable_choice": ("[params]\nBLOCK_M = [16]\n\n[params.x]\ny = 1\n", "params.x"),
    "launch_not_a_table": ('launch = "num_warps"\n[params]\nBLOCK_M = [16]\n', "launch"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_space_file_is_one_line_naming_file_and_key(tmp_path, name):
    text, key = BAD_FILES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(TunesvcError) as info:
        Space.from_toml(path, problem_vars=PROBLEM_VARS)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    if key is not None:
        assert key in message


def test_constraint_code_is_never_executed(tmp_path):
    path = tmp_path / "evil.toml"
    path.write_text(GOOD_PARAMS + "\n[constraints]\nsmem = \"__import__('os').system('touch pwned') == 0\"\n")
    with pytest.raises(TunesvcError, match=r"constraints\.smem"):
        Space.from_toml(path, problem_vars=PROBLEM_VARS)
    assert not (tmp_path / "pwned").exists()


def test_expression_rejects_calls_at_parse_time():
    with pytest.raises(ValueError, match="not allowed"):
        Expression("__import__('os').system('x')")
    with pytest.raises(ValueError, match="not allowed"):
        Expression("BLOCK_M.real > 0")


def test_expression_evaluates_the_whitelist():
    expr = Expression("cdiv(M, BLOCK_M) > 1 and next_pow2(N) == 64 or not (abs(-K) > min(K, 3))")
    assert expr.names == {"M", "BLOCK_M", "N", "K"}
    assert expr({"M": 40, "BLOCK_M": 16, "N": 45, "K": 5}) is True  # first clause
    assert expr({"M": 16, "BLOCK_M": 16, "N": 45, "K": 2}) is True  # second clause
    assert expr({"M": 16, "BLOCK_M": 16, "N": 45, "K": 5}) is False
    assert expr({"M": 40, "BLOCK_M": 16, "N": 65, "K": 5}) is False
    assert Expression("BLOCK_M if M > 8 else 0")({"M": 9, "BLOCK_M": 32}) == 32
    assert Expression("1 < M <= 4")({"M": 5}) is False


@pytest.mark.parametrize(
    "source, env",
    [
        ("(M and 0) + (N or 7) + (not M)", {"M": 3, "N": 0}),  # and/or give a bool, as all()/any() do
        ("min + min(1, M)", {"min": 5, "M": 0}),  # a variable may not shadow a function
        ("M / N > 2 ** K - 1 >= -M // 3 % 2", {"M": 7, "N": 2, "K": 1}),
        ("BLOCK_M if M > 8 else N", {"M": 8, "BLOCK_M": 32, "N": 1}),
        ("V != 'a' or cdiv(M, 16) * next_pow2(N) <= max(abs(-K), 3)", {"V": "a", "M": 33, "N": 5, "K": 4}),
        ("M > 0 or X > 0", {"M": 1}),  # X is never looked up, so its absence is no error
    ],
)
def test_compiled_expression_matches_the_interpreter(source, env):
    expr = Expression(source)
    value = expr(env)
    assert value == expr.interpret(env)
    assert type(value) is type(expr.interpret(env))


def test_expression_pickles_as_its_text():
    expr = pickle.loads(pickle.dumps(Expression("cdiv(M, 16) > 1 and V == 'a'")))
    assert expr.source == "cdiv(M, 16) > 1 and V == 'a'"
    assert expr({"M": 17, "V": "a"}) is True


def test_compiled_expression_fails_like_the_interpreter():
    for source, env, error in [
        ("M // N > 0", {"M": 1, "N": 0}, ZeroDivisionError),
        ("M > 0 and X > 0", {"M": 1}, KeyError),
    ]:
        with pytest.raises(error):
            Expression(source).interpret(env)
        with pytest.raises(error):
            Expression(source)(env)


#: dims of each test problem, in a template's dims order: tiny, odd, mixed and large sizes
PROBLEM_SIZES = [(1, 1, 1, 1, 1), (45, 3, 77, 129, 1023), (127, 4096, 16, 1000, 33), (4096, 4096, 4096, 4096, 4096)]


def _problems(template):
    for i, sizes in enumerate(PROBLEM_SIZES):
        dims = dict(zip(template.dims, sizes))
        if "D" in dims:  # attention and decode take head dims of 64 or 128 only
            dims["D"] = (64, 128)[i % 2]
        if "HKV" in dims:  # decode: HQ a multiple of HKV
            dims["HKV"] = (1, dims["HQ"])[i % 2]
        options = {name: allowed[i % len(allowed)] for name, allowed in template.options.items()}
        yield template.problem(**dims, **options, dtype=template.dtypes[i % len(template.dtypes)])


@pytest.mark.parametrize("name", list(SHIPPED))
def test_feasible_equals_the_interpreter_for_every_shipped_template(name, device):
    template = tunesvc.get_template(name)
    space = template.space
    hopper = {"kind": "cuda", "capability": "9.0", "sm_count": 132, "max_shared_memory": 232448, "max_num_regs": 65536}
    ampere = {**hopper, "capability": "8.0", "sm_count": 108, "max_shared_memory": 166912}
    devices = [device, dataclasses.replace(device, **hopper), dataclasses.replace(device, **ampere)]
    for problem in _problems(template):
        for dev in devices:
            env = {**dev.limits(), **template.problem_vars(problem)}
            reference = [
                c for c in space.enumerate() if all(e.interpret({**env, **c}) for e in space.constraints.values())
            ]
            assert template.feasible(problem, dev) == reference, (problem, dev.capability)


def test_feasible_checks_each_constraint_once_its_names_are_set():
    data = {
        "params": {"M": [8, 16], "B": [1, 2, 4]},  # M shadows the problem's M, as in violations()
        "constraints": {"fits": "B * M <= cap", "small": "M < 16"},
    }
    space = Space.from_dict(data, problem_vars=("M", "cap"))
    expected = [{"M": 8, "B": 1}, {"M": 8, "B": 2}]
    assert space.feasible({"M": 99, "cap": 16}, {}) == expected
    assert [c for c in space.enumerate() if not space.violations(c, {"M": 99, "cap": 16}, {})] == expected
    # a constraint on the problem alone prunes everything before any parameter is set
    never = Space.from_dict({**data, "constraints": {"never": "cap < 0"}}, problem_vars=("cap",))
    assert never.feasible({"cap": 1}, {}) == []


def _tiles() -> Space:
    data = {
        "params": {"VARIANT": ["plain", "split"], "BLOCK": [16, 32, 64, 128], "GROUP": [1, 8]},
        "launch": {"num_warps": [2, 4, 8]},
        # rows no more than the problem's; two warps per 8 rows at least; splitting needs a short problem
        "constraints": {
            "tile": "BLOCK <= max(16, M)",
            "warps": "num_warps * 8 <= BLOCK",
            "split": "VARIANT == 'plain' or M <= 32",
        },
    }
    return Space.from_dict(data, problem_vars=("M",))


def test_distance_counts_doublings_of_sizes_and_other_values_as_one():
    space = _tiles()
    a = {"VARIANT": "plain", "BLOCK": 128, "GROUP": 1, "num_warps": 8}
    assert space.distance(a, a) == 0
    assert space.distance(a, {**a, "BLOCK": 32}) == 2
    assert space.distance(a, {**a, "GROUP": 8, "VARIANT": "split"}) == 3 + 1


def test_nearest_changes_only_what_the_broken_constraints_name():
    space = _tiles()
    big = {"VARIANT": "split", "BLOCK": 128, "GROUP": 8, "num_warps": 8}
    assert space.nearest(big, {"M": 32}, {}) == {**big, "BLOCK": 32, "num_warps": 4}  # tile, then warps, repaired
    # splitting broken too (M > 32): the variant goes, the group stays
    assert space.nearest(big, {"M": 64}, {}) == {**big, "VARIANT": "plain", "BLOCK": 64}
    # a feasible config is its own nearest
    fits = {"VARIANT": "plain", "BLOCK": 64, "GROUP": 8, "num_warps": 4}
    assert space.nearest(fits, {"M": 500}, {}) == fits
    # every answer is feasible, and no feasible config is nearer
    for m in (1, 17, 30, 50, 100, 500):
        feasible = space.feasible({"M": m}, {})
        for config in space.enumerate():
            found = space.nearest(config, {"M": m}, {}, within=math.inf)
            assert found is not None and not space.violations(found, {"M": m}, {})
            assert space.distance(config, found) == min(space.distance(config, c) for c in feasible)


def test_nearest_gives_up_beyond_its_reach():
    space = _tiles()
    big = {"VARIANT": "plain", "BLOCK": 128, "GROUP": 1, "num_warps": 8}
    # 16 rows on 2 warps is 3 + 2 doublings away
    assert space.nearest(big, {"M": 5}, {}, within=4.0) is None
    assert space.nearest(big, {"M": 5}, {}, within=5.0) == {**big, "BLOCK": 16, "num_warps": 2}
    assert space.nearest(big, {"M": 5}, {}, limit=2) is None
    # a config outside the space has no nearest
    assert space.nearest({**big, "BLOCK": 48}, {"M": 5}, {}) is None


def test_nearest_feasible_of_a_real_template_is_feasible_and_near(template, device):
    problem = template.problem(M=24, N=300, K=77)
    projected = 0
    for config in template.feasible(template.problem(M=1000, N=300, K=77), device)[::7]:
        found = template.nearest_feasible(config, problem, device)
        if found is not None:
            projected += found != config
            assert not template.violations(found, problem, device)
            assert template.space.distance(config, found) <= 4.0
            if not template.violations(config, problem, device):
                assert found == config
    assert projected  # most tiles of 1000 rows break a rule of 24 rows, and most have a near repair


def test_missing_space_file(tmp_path):
    with pytest.raises(TunesvcError, match="space file not found") as info:
        Space.from_toml(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(info.value)


def test_from_toml_accepts_a_valid_custom_file(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text(
        GOOD_PARAMS
        + '\n[launch]\nnum_warps = [4, 8]\n\n[constraints]\nsmem = "BLOCK_M * BLOCK_K * elem_bytes <= max_shared_memory"\n'
    )
    space = Space.from_toml(path, problem_vars=PROBLEM_VARS)
    assert space.size == 2 * 3 * 2
    feasible = space.feasible(
        {"M": 1, "N": 1, "K": 1, "elem_bytes": 2}, {"max_shared_memory": 2048, "sm_count": 1, "max_num_regs": 1}
    )
    # BLOCK_M * BLOCK_K * 2 <= 2048 -> BLOCK_M * BLOCK_K <= 1024
    assert {(c["BLOCK_M"], c["BLOCK_K"]) for c in feasible} == {(16, 16), (16, 32), (16, 64), (32, 16), (32, 32)}
