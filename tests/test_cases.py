import math

import pytest

from kbench.problems.cases import plan_cases, select
from kbench.problems.load import load_task


@pytest.fixture(scope="module")
def task():
    return load_task("l2norm")


def test_plan_is_reproducible_and_fresh_per_seed(task):
    assert plan_cases(task, 7) == plan_cases(task, 7)
    shapes_a = [tuple(c.params.values()) for c in plan_cases(task, 7)]
    shapes_b = [tuple(c.params.values()) for c in plan_cases(task, 8)]
    assert shapes_a != shapes_b


def test_plan_covers_edges_random_shapes_dtypes_and_distributions(task):
    cases = plan_cases(task, 123)
    spec = task.correctness
    assert len(cases) == len(spec.fixed_shapes) + spec.random_cases
    assert [c.params for c in cases[:len(spec.fixed_shapes)]] == list(spec.fixed_shapes)
    assert {c.dtype for c in cases} == set(task.dtypes)
    assert {c.distribution for c in cases} == set(spec.distributions)
    assert [c.index for c in cases] == list(range(len(cases)))
    first_other = next(i for i, c in enumerate(cases) if c.dtype != "float32")
    assert all(c.dtype == "float32" for c in cases[:first_other])
    for case in cases[len(spec.fixed_shapes):]:
        assert math.prod(case.params.values()) <= spec.max_elements
        for d, (lo, hi) in zip(case.params.values(), spec.random_shape, strict=True):
            assert lo <= d <= hi
    assert len({c.seed for c in cases}) == len(cases)


def test_select_cases(task):
    cases = plan_cases(task, 1)
    assert [c.index for c in select(cases, [3, 1, 3])] == [1, 3]
    assert select(cases, None) == cases
    with pytest.raises(ValueError, match="--case 999"):
        select(cases, [999])
