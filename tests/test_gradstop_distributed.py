"""Unit tests of gradstop.distributed (chapter 12's runner) and gradstop.ddp_workers.

The runner's promises: results in rank order; a worker's error comes back with its
type and message; a rank that hangs fails the run with TimeoutError within a bounded
time, instead of hanging the notebook; nothing listens beyond 127.0.0.1. The workers'
numbers are the chapter's, checked against closed forms.
"""

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from gradstop import ddp_workers as W
from gradstop import distributed as gpd

# --- workers the tests need (the ranks import this module by name) -------------------


def sleep_forever():
    while True:
        time.sleep(1)


def fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    return "fine"


def fail_on_rank_0_while_rank_1_waits():
    if dist.get_rank() == 0:
        raise KeyError("rank 0 leaves")
    dist.all_reduce(torch.ones(1))  # waits for rank 0, which never comes


class CustomError(Exception):
    pass


def raise_custom():
    raise CustomError("not a built-in")


def write_to_stderr():
    print(f"hello from rank {dist.get_rank()}", file=sys.stderr)
    return dist.get_rank()


def how_the_group_was_made():
    return {"backend": dist.get_backend(), "interface": os.environ.get("GLOO_SOCKET_IFNAME")}


# --- the runner ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    with gpd.Cluster(world_size=2, timeout=60) as running:
        yield running


def test_results_come_back_in_rank_order(cluster):
    assert cluster.run(W.average_of_ranks) == [[3.0], [3.0]]
    assert cluster.run(write_to_stderr) == [0, 1]


def test_the_group_is_gloo_on_the_loopback_interface(cluster):
    ranks = cluster.run(how_the_group_was_made)
    assert all(r["backend"] == "gloo" for r in ranks)
    if sys.platform.startswith("linux"):
        assert all(r["interface"] == "lo" for r in ranks)
    assert gpd.HOST == "127.0.0.1"


def test_each_ranks_standard_error_is_kept(cluster):
    cluster.run(write_to_stderr)
    assert cluster.stderr == [["hello from rank 0"], ["hello from rank 1"]]
    cluster.run(W.average_of_ranks)
    assert cluster.stderr == [[], []]  # only the last run's


def test_cpp_warning_prefixes_are_removed():
    line = "[rank0]:[W1202 01:43:45.774972239 reducer.cpp:1529] Warning: flag is slow (x)"
    assert gpd._C10_PREFIX.sub("", line) == "flag is slow (x)"
    assert gpd._C10_PREFIX.sub("", "plain text") == "plain text"


def test_a_workers_error_comes_back_with_its_type_and_message(cluster):
    starts = cluster.starts
    with pytest.raises(ValueError) as raised:
        cluster.run(fail_on_rank_1)
    assert str(raised.value) == "boom on rank 1"
    assert raised.value.__notes__ == [
        "(raised in rank 1 of the distributed run 'fail_on_rank_1'; ranks that raised: [1])"
    ]
    assert "ValueError: boom on rank 1" in raised.value.worker_traceback
    # the ranks left their group and joined a new one: no new processes
    assert cluster.run(W.average_of_ranks) == [[3.0], [3.0]]
    assert cluster.starts == starts


def test_a_display_of_one_line_keeps_every_word():
    error = RuntimeError("first line `a`\nsecond `b`\n third")
    error.add_note("(a note)")
    assert gpd._one_line(error) == ["RuntimeError: first line `a` second `b` third", "(a note)"]


def test_an_error_not_built_in_comes_back_as_runtime_error_naming_it(cluster):
    with pytest.raises(RuntimeError) as raised:
        cluster.run(raise_custom)
    assert str(raised.value) == "test_gradstop_distributed.CustomError: not a built-in"


def test_an_error_while_another_rank_waits_is_raised_not_a_timeout(cluster):
    started = time.monotonic()
    with pytest.raises(KeyError) as raised:
        cluster.run(fail_on_rank_0_while_rank_1_waits, timeout=30)
    assert "stopped while silent: [1]" in raised.value.__notes__[0]
    assert time.monotonic() - started < 30  # GRACE seconds, not the whole timeout
    starts = cluster.starts
    assert cluster.run(W.average_of_ranks) == [[3.0], [3.0]]  # new processes
    assert cluster.starts == starts + 1


def test_a_rank_that_never_answers_times_out_with_a_clear_error(cluster):
    assert cluster.run(W.average_of_ranks) == [[3.0], [3.0]]
    starts, started = cluster.starts, time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        cluster.run(sleep_forever, name="sleeper", timeout=2)
    took = time.monotonic() - started
    assert str(raised.value) == (
        "the distributed run 'sleeper' did not finish within 2 s: rank(s) [0, 1] gave "
        "no answer, so every rank was stopped (the next run starts new processes)"
    )
    assert took < 2 + 30, f"the timeout took {took:.0f} s to fire"  # bounded, not hung
    assert "not started" in repr(cluster)
    assert cluster.run(W.average_of_ranks) == [[3.0], [3.0]]  # and it starts again
    assert cluster.starts == starts + 1


def test_workers_a_spawned_rank_cannot_import_are_refused(cluster):
    def local():
        return 1

    for worker in (local, lambda: 1, "average_of_ranks"):
        with pytest.raises(TypeError, match="top level of a module"):
            cluster.run(worker)
    local.__module__ = "__main__"
    local.__qualname__ = "local"
    with pytest.raises(TypeError, match="defined in __main__"):
        cluster.run(local)


@pytest.mark.parametrize(
    "kwargs", [{"world_size": 0}, {"world_size": True}, {"timeout": 0}, {"start_timeout": -1}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        gpd.Cluster(**kwargs)


def test_show_prints_a_workers_source():
    shown = gpd.show(W.average_of_ranks)
    assert shown.data.startswith("```python\ndef average_of_ranks")
    assert shown.data.endswith("```")


def test_free_port_is_on_the_loopback_address():
    port = gpd.free_port()
    assert 0 < port < 65536


# --- the chapter's experiments ------------------------------------------------------


def test_a_hook_sees_its_ranks_gradient_and_grad_gets_the_average(cluster):
    for rank, events in enumerate(cluster.run(W.hooks_and_reduction)):
        seen = dict(events)
        own = [2.0 * (rank + 1)] * 3
        assert seen["tensor hook"] == seen["post-accumulate hook"] == own
        assert seen["comm hook: bucket in"] == own
        assert seen[".grad after backward()"] == seen["comm hook: bucket out"] == [3.0] * 3


@pytest.mark.parametrize("wrap", ["compile(DDP(net))", "DDP(compile(net))"])
def test_compiled_the_hooks_see_the_same_gradients_in_the_same_order(cluster, wrap):
    eager = cluster.run(W.hooks_and_reduction)
    assert cluster.run(W.hooks_and_reduction, wrap=wrap) == eager


@pytest.mark.parametrize("hook", ["tensor hook", "post-accumulate hook"])
def test_a_hook_that_scales_rank_0_changes_every_rank(cluster, hook):
    ranks = cluster.run(W.hooks_and_reduction, scale_on_rank_0=hook)
    assert [dict(events)[".grad after backward()"] for events in ranks] == [[12.0] * 3] * 2


def test_a_detach_fails_the_second_step_and_leaves_the_first_unaveraged(cluster):
    first = cluster.run(W.train_steps, steps=1)
    assert [run["steps"][0]["head"] for run in first] == [[3.0] * 3, [6.0] * 3]
    with pytest.raises(RuntimeError, match="^Expected to have finished reduction") as raised:
        cluster.run(W.train_steps, steps=2)
    assert "did not receive grad for rank 0: 0\n" in str(raised.value)
    caught = cluster.run(W.train_steps, steps=3, catch=True)
    assert [run["failed"][0] for run in caught] == [2, 2]


@pytest.mark.parametrize(
    "options, bucket, unused",
    [
        ({"find_unused_parameters": True}, 48, 36),
        ({"static_graph": True}, 48, 36),
        ({"freeze": True}, 12, 0),
    ],
)
def test_each_fix_runs_and_costs_what_ddp_reports(cluster, options, bucket, unused):
    for run in cluster.run(W.train_steps, steps=3, **options):
        assert [s["head"] for s in run["steps"]] == [[4.5] * 3] * 3
        assert (run["bucket bytes"], run["unused bytes"]) == (bucket, unused)


def test_freezing_after_wrapping_fails_like_the_detach(cluster):
    late = cluster.run(W.train_steps, steps=3, freeze="after", catch=True)
    assert [run["failed"][0] for run in late] == [2, 2]
    assert late[0]["failed"][1].startswith("Expected to have finished reduction")


@pytest.mark.parametrize("wrap", ["compile(DDP(net))", "DDP(compile(net))"])
def test_a_compiled_detach_raises_nothing_and_leaves_zeros_that_adamw_decays(cluster, wrap):
    for run in cluster.run(W.compiled_steps, wrap=wrap, steps=2):
        assert run["failed"] is None
        assert [s["body"] for s in run["steps"]] == [[0.0] * 9] * 2
        assert [s["head"] for s in run["steps"]] == [[4.5] * 3] * 2
        torch.testing.assert_close(torch.tensor(run["body after AdamW"]), torch.full((9,), 0.99))
    for run in cluster.run(W.compiled_steps, wrap=wrap, steps=2, find_unused_parameters=True):
        assert [s["body"] for s in run["steps"]] == [None, None]
        assert run["body after AdamW"] == [1.0] * 9


def test_a_larger_compiled_model_fails_like_eager_unless_the_graph_is_not_split(cluster):
    split = cluster.run(W.compiled_big_steps, wrap="compile(DDP(net))")
    assert [run["failed"][0] for run in split] == [2, 2]
    whole = cluster.run(W.compiled_big_steps, wrap="compile(DDP(net))", optimize_ddp=False)
    assert [run["body"] for run in whole] == [["zeros"] * 3] * 2


def test_the_same_detach_run_eagerly_fails_at_step_2(cluster):
    run = cluster.run(W.compiled_steps, wrap="eager DDP(net)")[0]
    assert run["failed"][0] == 2 and run["body after AdamW"] is None


def test_static_graph_fails_when_the_graph_changes(cluster):
    with pytest.raises(RuntimeError, match="your training graph has changed"):
        cluster.run(W.train_steps, forward="detach() every other step", steps=3, static_graph=True)
    # cut first, used next: one step earlier, another message
    with pytest.raises(RuntimeError, match="^Your training graph has changed .* unused in first"):
        cluster.run(W.train_steps, forward="detach() on odd steps", steps=3, static_graph=True)


def test_the_debug_variable_names_the_parameter_and_is_put_back(cluster):
    named = cluster.run(W.train_steps, steps=2, catch=True, debug="INFO")
    assert [run["failed"][2][0] for run in named] == [
        f"Parameters which did not receive grad for rank {rank}: body.weight" for rank in (0, 1)
    ]
    plain = cluster.run(W.train_steps, steps=2, catch=True)  # the level was reset after the run
    assert not any(line.startswith("Parameters ") for line in plain[0]["failed"][2])


def test_no_sync_keeps_each_ranks_sum_then_averages(cluster):
    passes = cluster.run(W.accumulate, inside=2)
    assert passes == [
        [[1.0] * 3, [2.0] * 3, [4.5] * 3],
        [[2.0] * 3, [4.0] * 3, [4.5] * 3],
    ]


def test_no_sync_with_a_detach_averages_nothing_and_the_next_forward_raises(cluster):
    runs = cluster.run(W.accumulate_detached, inside=1)
    for rank, (heads, outcome) in enumerate(runs):
        own = 3.0 * (rank + 1)
        assert heads == [[own] * 3, [2 * own] * 3]  # inside, then after: each rank's own
        assert outcome.startswith("Expected to have finished reduction in the prior")


def test_fp16_compression_sums_each_ranks_float16_share(cluster):
    local = torch.tensor(W.LOCAL)
    halves = [(local * (rank + 1)).half() / 2 for rank in range(2)]
    fp16 = cluster.run(W.compressed, hook="fp16")
    assert fp16[0] == fp16[1] == (halves[0] + halves[1]).float().tolist()
    with pytest.raises(ValueError, match="hook must be"):
        cluster.run(W.compressed, hook="bf16")


def test_syncbatchnorm_refuses_cpu(cluster):
    with pytest.raises(ValueError, match="^SyncBatchNorm expected input tensor to be on GPU"):
        cluster.run(W.sync_batchnorm_refused)


@pytest.mark.parametrize("variant", W.SIMSIAM_VARIANTS)
def test_cpu_syncbatchnorm_computes_what_one_process_computes_on_the_whole_batch(cluster, variant):
    for run in cluster.run(W.simsiam_sync_batchnorm, variant=variant):
        assert run["z1 as one process"] and run["grads as one process"], variant
        torch.testing.assert_close(
            torch.tensor(run["running mean"]), torch.tensor(run["whole running mean"])
        )
        assert run["forward"] == ["all_gather", "all_gather"]
        one_sided = variant in ("target detached", "target under no_grad()")
        assert run["backward"] == ["all_reduce"] * (1 if one_sided else 2)


def test_plain_batchnorm_shares_nothing(cluster):
    for run in cluster.run(W.simsiam_sync_batchnorm, sync=False):
        assert run["forward"] == run["backward"] == []
        assert not run["z1 as one process"]


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="forward must be one of"):
        W.Net("head(body(x)) twice")
    with pytest.raises(ValueError, match="variant must be one of"):
        W.simsiam_sync_batchnorm(variant="BYOL")
    with pytest.raises(ValueError, match="wrap must be one of"):
        W.compiled_steps(wrap="jit(DDP(net))")
    with pytest.raises(ValueError, match="freeze must be"):
        W.train_steps(freeze="before")
    with pytest.raises(ValueError, match="wrap must be one of"):
        W.hooks_and_reduction(wrap="jit(DDP(net))")
    with pytest.raises(ValueError, match="wrap must be one of"):
        W.compiled_big_steps(wrap="jit(DDP(net))")
    with pytest.raises(ValueError, match="debug must be one of"):
        W.train_steps(debug="VERBOSE")
