"""CPU smoke tests of the whole-step benchmarks (issue #17): each script runs end to end on a tiny model
and writes its report. No timing is asserted; what is asserted is what makes the figures mean anything
on the GPU: the trainers compared really make the same updates (equal losses), the step's components
add up to its wall time, SFT really ran, the ceiling replayed the step's own calls."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout_s: float = 540, returncode: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == returncode, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["tiny", "tiny-qwen3.5"])
def test_sft_throughput_packed_variants_train_like_the_padded_one(tmp_path, model):
    """Qwen3's shape, and Qwen3.5's hybrid (linear-attention layers get the packed rows' boundaries)."""
    out = tmp_path / "sft.json"
    run_script(
        "sft_throughput.py",
        "--model",
        model,
        "--seq",
        "256",
        "--minibatch",
        "4",
        "--updates",
        "1",
        "--warmup",
        "0",
        "--variants",
        "var-bucket,var-pack,var-pack-flex,var-pack-varlen,var-pack-varlen-fixed-compile,"
        "var-pack-flex-fixed-compile,var-pack-flex-fixed-compile-eager-loss",
        "--json",
        str(out),
    )
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert results["var-pack-flex"]["attention"] == "flex" and results["var-pack"]["attention"] == "sdpa"
    assert results["var-pack-varlen"]["attention"] == "varlen"
    # the same sequences, the same update: padding, dense-mask packing, flex and varlen packing (the CPU stand-in),
    # and rows filled by tokens through compiled layers, with the LM head's loss compiled or eager, agree
    # (fp32 on the CPU)
    for name in (
        "var-pack",
        "var-pack-flex",
        "var-pack-varlen",
        "var-pack-varlen-fixed-compile",
        "var-pack-flex-fixed-compile",
        "var-pack-flex-fixed-compile-eager-loss",
    ):
        assert results[name]["loss"] == pytest.approx(results["var-bucket"]["loss"], rel=1e-5)
    fixed = results["var-pack-varlen-fixed-compile"]
    assert fixed["pack_tokens"] == 256 * 2 and fixed["graphs_warmup"] > 0 and fixed["graphs_timed"] == 0
    assert results["var-pack"]["token_efficiency"] == 1.0  # packed without padding
    assert results["var-bucket"]["token_efficiency"] < 1.0


def check_comparison(report: dict, trainers: list[str], lengths: list[str]) -> None:
    assert [run["lengths"] for run in report["runs"]] == lengths
    for run in report["runs"]:
        assert [r["trainer"] for r in run["results"]] == trainers
        compare = run["compare"]
        for r in run["results"]:
            assert compare[f"same_start/{r['trainer']}"] is True
            assert r["grad_ckpt"] is False
            assert len(r["losses"]) == 2 and r["tokens_per_s"] > 0
            # the bar is 1e-3 after the same updates; fp32 on the CPU agrees far closer
            assert compare[f"loss_gap/{r['trainer']}"] < 1e-4
            assert compare[f"held_out_gap/{r['trainer']}"] < 1e-4
        whale = run["results"][0]
        # and the updates did move the loss, by far more than the gaps allowed above
        assert abs(whale["losses"][1] - whale["losses"][0]) > 1e-3
        assert all(f"whale/{peer}" in compare for peer in trainers if not peer.startswith("whale"))


SMOKE = [
    "--model",
    "tiny",
    "--seq",
    "128",
    "--minibatch",
    "4",
    "--micro",
    "2",
    "--updates",
    "2",
    "--warmup",
    "0",
    "--lr",
    "1e-3",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_vs_hf_trainer_makes_the_same_updates(tmp_path):
    out = tmp_path / "cmp.json"
    trainers = ["whale", "whale-pack", "hf", "hf-flat"]
    run_script("sft_vs_trl.py", *SMOKE, "--lengths", "variable", "--trainers", ",".join(trainers), "--json", str(out))
    check_comparison(json.loads(out.read_text()), trainers, ["variable"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_vs_hf_trainer_on_the_hybrid_model_makes_the_same_updates(tmp_path):
    """Qwen3.5's shape: whale padded and packed against the HF Trainer padded (its padding-free mode runs the
    linear-attention layers across the packed row on the CPU, so it is not a peer of the same updates here)."""
    out = tmp_path / "cmp.json"
    trainers = ["whale", "whale-pack", "hf"]
    smoke = [*SMOKE]
    smoke[smoke.index("tiny")] = "tiny-qwen3.5"
    run_script("sft_vs_trl.py", *smoke, "--lengths", "variable", "--trainers", ",".join(trainers), "--json", str(out))
    check_comparison(json.loads(out.read_text()), trainers, ["variable"])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None,
    reason="TRL is the benchmark extra: pip install .[benchmark]",
)
def test_sft_vs_trl_makes_the_same_updates(tmp_path):
    out = tmp_path / "cmp.json"
    trainers = ["whale", "trl", "trl-pad"]
    proc = run_script(
        "sft_vs_trl.py", *SMOKE, "--lengths", "fixed,variable", "--trainers", ",".join(trainers), "--json", str(out)
    )
    report = json.loads(out.read_text())
    check_comparison(report, trainers, ["fixed", "variable"])
    # the peers say each update as it ends (the Trainer itself prints nothing), so a run cut off still shows progress
    lines = proc.stderr.splitlines()
    for peer in ("trl", "trl-pad"):
        updates = [r["seconds"] for run in report["runs"] for r in run["results"] if r["trainer"] == peer]
        assert sum(x.startswith(f"{peer}: training begins ") for x in lines) == len(updates) == 2
        assert [x for x in lines if x.startswith(f"{peer}: update ")] == [
            f"{peer}: update {i + 1} took {t:.1f} s" for seconds in updates for i, t in enumerate(seconds)
        ]
    variable = {r["trainer"]: r for r in report["runs"][1]["results"]}
    assert variable["trl"]["padding_free"] is True and variable["trl-pad"]["padding_free"] is False
    assert report["meta"]["trl"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trainer_over_its_budget_is_reported_with_how_far_it_got(tmp_path):
    """``--budget-s``: a trainer that does not finish in time is a result (the issue's rule for a peer that does
    not finish), written into the JSON with its progress, and the benchmark goes on to the next trainer and exits
    0 instead of being killed from outside with nothing written. A budget of a millisecond runs out in every
    trainer, before any update."""
    out = tmp_path / "cmp.json"
    run_script(
        "sft_vs_trl.py",
        *SMOKE,
        "--lengths",
        "variable",
        "--trainers",
        "whale,hf",
        "--budget-s",
        "0.001",
        "--json",
        str(out),
    )
    (run,) = json.loads(out.read_text())["runs"]
    by = {r["trainer"]: r for r in run["results"]}
    assert set(by) == {"whale", "hf"}
    for record in by.values():
        assert record["did_not_finish"] is True and record["budget_s"] == 0.001
        assert record["error"].startswith("did not finish within --budget-s 0.001")
        assert record["rang_in"] and all(" in " in frame for frame in record["rang_in"])  # where the time ran out
        assert set(record["compiled"]) == {
            "frames_started",
            "frames_done",
            "unique_graphs",
            "graph_breaks",
        }
        assert all(isinstance(n, int) and n >= 0 for n in record["compiled"].values())
    assert by["whale"]["progress"] is None  # whale's trainer keeps no update clock
    assert by["hf"]["progress"]["updates_done"] == 0 and by["hf"]["progress"]["seconds"] == []
    assert run["compare"] == {}


@pytest.mark.parametrize(
    ("given", "said"), [("0", "0"), ("-5", "-5"), ("nan", "nan"), ("inf", "inf"), ("1e9", "1e+09")]
)
def test_a_budget_must_be_a_positive_finite_number_of_seconds(given, said):
    """Out of range, the alarm's timer would raise (NaN, infinity, beyond ``time_t``) or never arm: a clear error
    naming the option instead of a traceback."""
    proc = run_script("sft_vs_trl.py", f"--budget-s={given}", timeout_s=120, returncode=2)
    assert f"--budget-s must be a positive number of seconds, at most 604800 (a week), not {said}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("reply_tokens", [0, 16])
def test_rsft_step_splits_a_whole_step_through_the_workload(tmp_path, reply_tokens):
    out = tmp_path / "step.json"
    extra = ["--reply-tokens", str(reply_tokens)] if reply_tokens else []
    proc = run_script("rsft_step.py", "--smoke", *extra, "--workdir", str(tmp_path / "work"), "--json", str(out))
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert "partial" not in report  # the partial report written before the ceiling was replaced by the whole one
    # the steps' headline figures reach the terminal before the ceiling's replay, which a device call may cut off
    (line,) = [x for x in proc.stderr.splitlines() if "steps measured, the ceiling next: " in x]
    shown = json.loads(line.split("steps measured, the ceiling next: ", 1)[1])
    assert [s["step"] for s in shown] == [1, 2]
    assert shown[-1]["wall_s"] == pytest.approx(steps[-1]["wall_s"], abs=1e-4)
    kept = {m["step"]: m["kept"] for m in report["metrics"]}
    for step in steps:
        assert step["completions"] == 4 and 0 <= step["truncated"] <= 4  # 2 prompts x 2 rollouts, one turn each
        assert step["mean_completion_tokens"] == pytest.approx(step["generated_tokens"] / 4)
        assert step["kept"] == kept[step["step"]]
    if reply_tokens:
        # the bare answer is 8 tokens (and the smoke run's default cap 12): the filler made the replies long
        assert report["meta"]["args"]["max_tokens"] == reply_tokens + 16
        assert all(s["mean_completion_tokens"] > 12 for s in steps)
    assert [s["step"] for s in steps] == [1, 2]
    main = ("generation", "reward", "collation", "sft", "sync", "checkpoint", "checkpoint_wait", "sleep_wake", "other")
    for step in steps:
        seconds = step["seconds"]
        total = sum(seconds[k] for k in main) + seconds.get("evaluation", 0.0)
        assert total == pytest.approx(step["wall_s"], rel=1e-6)
        assert all(seconds[k] >= 0 for k in ("generation", "collation", "sft", "sync", "checkpoint", "checkpoint_wait"))
        assert seconds["generation"] > 0 and step["generated_tokens"] > 0
        assert 0 < step["overhead_share"] < 1
        assert seconds["sleep_wake"] == 0.0  # the in-process backend has no server to put to sleep
        # sampling outside the model calls: before the first and after the last are part of it
        assert step["sample_head_s"] >= 0 and step["sample_tail_s"] >= 0
        assert step["sample_head_s"] + step["sample_tail_s"] <= seconds["reward"] + 1e-6
        assert step["collation_encode_s"] >= 0 and step["collation_batches_s"] >= 0
        assert step["collation_encode_s"] + step["collation_batches_s"] == pytest.approx(seconds["collation"])
        assert 0 <= step["gc_full_s"] <= step["gc_pause_s"] < step["wall_s"]
        assert step["gc_full_collections"] >= 0
    last = steps[-1]
    assert last["seconds"]["checkpoint"] > 0 and last["seconds"]["evaluation"] > 0  # the evaluation-point step
    assert steps[0]["seconds"]["checkpoint"] == 0.0  # an ordinary step saves nothing
    # SFT really ran in the measured steps: trajectories were kept and trained on
    assert all(m["kept"] > 0 and m["loss"] is not None for m in report["metrics"])
    assert last["seconds"]["sft"] > 0 and last["seconds"]["collation"] > 0
    # the ceiling replayed the last step's own calls: 2 prompts x 2 rollouts
    ceiling = report["ceiling"]
    assert ceiling["tokens"] > 0 and report["generation_vs_ceiling"] > 0
    assert report["eval"]["items"] == 2 and report["meta"]["backend"] == "transformers"
    assert report["meta"]["nvml"] is False or last["gpu_busy"] is not None


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_rsft_step_keeps_the_warm_up_model_by_its_build_arguments(tmp_path):
    """``--model-cache``: a second run with the same build arguments starts from the first's model; other
    arguments build anew; a build cut off leaves nothing a later run would take for a model."""
    cached_model = load_benchmark("rsft_step").cached_model
    builds: list[Path] = []

    def build(out: Path) -> dict:
        builds.append(out)
        out.mkdir(parents=True)
        (out / "weights").write_text(str(len(builds)))
        return {"format_updates": 10 * len(builds)}

    cache, key = tmp_path / "cache", {"model": "qwen3.5-2b", "format_updates": 20}
    first, warm = cached_model(cache, key, build, tmp_path / "unused")
    again, warm_again = cached_model(cache, dict(key), build, tmp_path / "unused")
    assert again == first and (first / "weights").read_text() == "1" and len(builds) == 1
    assert warm == {"format_updates": 10, "reused": False} and warm_again == {"format_updates": 10, "reused": True}
    other, _ = cached_model(cache, {**key, "format_updates": 40}, build, tmp_path / "unused")
    assert other != first and (other / "weights").read_text() == "2"

    def cut_off(out: Path) -> dict:
        out.mkdir(parents=True)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_model(cache, {**key, "format_updates": 80}, cut_off, tmp_path / "unused")
    rebuilt, warm_rebuilt = cached_model(cache, {**key, "format_updates": 80}, build, tmp_path / "unused")
    assert warm_rebuilt["reused"] is False and (rebuilt / "weights").read_text() == "3"
    fresh, _ = cached_model(None, key, build, tmp_path / "fresh")  # no cache: built where the run says, every time
    assert fresh == tmp_path / "fresh" and len(builds) == 4


@pytest.mark.timeout(300)
def test_rsft_step_warm_only_leaves_its_model_for_the_next_run(tmp_path):
    """``--warm-only --model-cache``: the first run builds the model and stops before any step; the next starts
    from the model it left."""
    cache, reports = tmp_path / "models", []
    for k in range(2):
        out = tmp_path / f"warm{k}.json"
        args = ["--smoke", "--warm-only", "--model-cache", str(cache), "--workdir", str(tmp_path / f"w{k}")]
        run_script("rsft_step.py", *args, "--json", str(out))
        reports.append(json.loads(out.read_text()))
    assert [r["warm_only"] for r in reports] == [True, True] and all("steps" not in r for r in reports)
    assert [r["meta"]["reused"] for r in reports] == [False, True]
    assert not (tmp_path / "w0" / "store").exists()  # nothing was stepped
    (model,) = [d for d in cache.iterdir() if not d.name.startswith(".")]
    assert (model / "bench-build.json").is_file() and (model / "config.json").is_file()


def test_the_vllm_server_of_the_benchmarks_names_the_root_cause_of_a_failed_start(tmp_path):
    """An engine that dies at start-up prints its error well above the API server's "see root cause above" tail:
    the benchmarks' error message leads with the log's distinct error lines."""
    bench = load_benchmark("weight_sync_vllm")
    log = tmp_path / "vllm.log"
    cause = "ValueError: Free memory on device (30.1/79.2 GiB) on startup is less than desired GPU memory utilization"
    lines = [
        "(EngineCore pid=7) INFO loading",
        f"(EngineCore pid=7) {cause}",
        f"(EngineCore pid=7) {cause}",
        *[f"(APIServer pid=2) File x.py, line {k}" for k in range(80)],
        "(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    log.write_text("\n".join(lines) + "\n")
    server = bench.Server(tmp_path, 1, log, [])
    server.log = log.open("ab")
    try:
        causes = server.causes().splitlines()
        assert causes == [cause, "RuntimeError: Engine core initialization failed. See root cause above."]
        assert cause not in server.tail()  # what the message held before: the last 60 lines only
    finally:
        server.log.close()


HOLDER = """
import os, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from weight_sync_vllm import Server
server = Server(Path(sys.argv[3]), 1, Path(sys.argv[3]) / "server.log", [])
# a stand-in for vllm serve: it names itself through the FIFO, then waits to be killed
server.launch([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
               "os.write(fd, str(os.getpid()).encode()); time.sleep(600)", sys.argv[4]])
print(server.proc.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.mark.timeout(120)
def test_the_vllm_server_of_the_benchmarks_dies_with_the_benchmark_even_by_sigkill(tmp_path):
    """A benchmark killed by ``timeout`` (or SIGKILL) left its vLLM server holding 28 GiB of the GPU, and the next
    run on the machine ran out of memory. The server now runs under the local runner's supervisor, whose watch pipe
    closes when the benchmark dies however it dies."""
    import select
    import signal
    import time

    fifo = tmp_path / "server.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(ROOT), str(ROOT / "benchmarks"), str(tmp_path), str(fifo)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([reader], [], [], 60)[0], "the stand-in server never started"
        server_pid = int(os.read(reader, 64).split()[0])
        supervisor_pid = int(holder.stdout.readline())
        server, supervisor = os.pidfd_open(server_pid), os.pidfd_open(supervisor_pid)
        assert not select.select([server, supervisor], [], [], 0)[0]  # both alive while the benchmark lives
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        alive = {server: "the server", supervisor: "its supervisor"}
        deadline = time.monotonic() + 60
        while alive:  # each round removes at least one, or fails at the deadline
            ready = select.select(list(alive), [], [], max(0.0, deadline - time.monotonic()))[0]
            assert ready, f"{sorted(alive.values())} still alive 60 s after the benchmark was killed"
            for fd in ready:
                del alive[fd]
        os.close(server)
        os.close(supervisor)
    finally:
        os.close(reader)
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stand_in", ["exits", "never_healthy"])
def test_the_vllm_server_of_the_benchmarks_is_stopped_when_it_does_not_come_up(tmp_path, stand_in):
    """A server that exits at start-up is reported with its cause; one that never answers /health is stopped at the
    deadline. Either way start() leaves nothing running, whatever its caller does with the error."""
    import select

    bench = load_benchmark("weight_sync_vllm")
    fifo = tmp_path / "server.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    code = {
        "exits": "print('ValueError: no room on the device', flush=True); sys.exit(3)",
        "never_healthy": "time.sleep(600)",
    }[stand_in]

    class StandIn(bench.Server):
        def command(self) -> list[str]:
            named = (
                "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(fd, str(os.getpid()).encode())"
            )
            return [sys.executable, "-c", f"{named}; {code}", str(fifo)]

    server = StandIn(tmp_path, 1, tmp_path / "server.log", [])  # port 1: nothing answers /health there
    try:
        with pytest.raises(RuntimeError) as failed:
            server.start(timeout_s=3.0)
        assert ("ValueError: no room on the device" if stand_in == "exits" else "not healthy after 3 s") in str(
            failed.value
        )
        assert server.proc is None and server.watch_w is None  # stopped: its pipe and log closed
        assert select.select([reader], [], [], 30)[0]
        pid = int(os.read(reader, 64))
        try:
            gone = os.pidfd_open(pid)
        except ProcessLookupError:  # already reaped: gone
            return
        try:
            assert select.select([gone], [], [], 30)[0], "the stand-in server outlived start()'s failure"
        finally:
            os.close(gone)
    finally:
        os.close(reader)
        server.stop()


def test_rsft_step_long_replies_put_the_answer_first_then_the_filler_then_eos():
    rsft_step = load_benchmark("rsft_step")
    from synthetic import tasks
    from synthetic.tiny_model import build_tokenizer, format_conversations
    from whale.rsft.collate import encode_trajectory
    from whale.rsft.rejection import Trajectory

    tokenizer = build_tokenizer()
    assert rsft_step.bench_conversations(8, 0) == format_conversations(8, 0, copy_prob=1.0)  # 0: as before
    for conv in rsft_step.bench_conversations(8, 0, reply_tokens=40):
        digit = tasks.extract_answer(conv[-1]["content"])
        assert conv[1]["content"] == tasks.user_prompt({"digit": digit})  # the asked digit, copied
        ids = tokenizer(conv[-1]["content"], add_special_tokens=False)["input_ids"]
        assert len(ids) == 7 + 40  # the answer tag, then exactly the filler
        # cut anywhere after the answer tag (maxResponseTokens), the reply still scores
        assert tasks.score(tokenizer.decode(ids[:7]), {"answer": digit}) == 1.0
        (example,) = encode_trajectory(tokenizer, Trajectory(prompt_index=0, messages=tuple(conv), reward=1.0))
        assert example.input_ids[-1] == tokenizer.eos_token_id


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--reply-tokens", "480"], "--max-tokens (64) must be >= --reply-tokens + 16 (496)"),
        (["--reply-tokens", "480", "--max-tokens", "512", "--max-model-len", "600"], "--max-model-len (600)"),
        (["--reply-tokens", "-1"], "--reply-tokens (-1) must be >= 0"),
    ],
)
def test_rsft_step_refuses_long_replies_that_do_not_fit(argv, named, capsys):
    rsft_step = load_benchmark("rsft_step")
    with pytest.raises(SystemExit) as exit_info:
        rsft_step.parse(argv)
    assert exit_info.value.code == 2 and named in capsys.readouterr().err
    args = rsft_step.parse(["--reply-tokens", "480", "--max-tokens", "512"])
    assert (args.reply_tokens, args.max_tokens, args.max_model_len, args.ceiling) == (480, 512, 1024, "server")


def test_rsft_step_server_replay_sends_the_step_calls_all_in_flight(failures):
    """The vLLM ceiling's client, against the OpenAI-shaped test double (no vLLM here): the recorded calls go
    out as the runtime sent them, twice (warm-up, timed), all at once, with the key; tokens from ``usage``."""
    rsft_step = load_benchmark("rsft_step")
    from whale.inference.base import InferenceError, SamplingParams

    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=33)
    calls = [
        {"messages": [{"role": "user", "content": f"Repeat the digit {i}."}], "sampling": sampling, "n": 1 + i % 2}
        for i in range(6)
    ]
    for c in calls:
        c["tools"] = None
    # each request is held until all of the pass's are in flight: sent one at a time, none would come back
    failures.reset(script=["gather"] * 2 * len(calls), api_key="bench-key")
    failures.gather = len(calls)
    ceiling = rsft_step.server_replay(failures.url, "failure-double", calls, api_key="bench-key")
    assert ceiling["backend"] == "vllm server replay (same calls, all in flight)"
    completions = sum(c["n"] for c in calls)
    assert ceiling["completions"] == completions and ceiling["requests"] == len(calls)
    assert ceiling["tokens"] == ceiling["warmup_tokens"] == 3 * completions  # the double's usage: 3 a completion
    assert ceiling["tokens_per_s"] == pytest.approx(ceiling["tokens"] / ceiling["seconds"])
    assert failures.max_in_flight == len(calls)  # all in flight at once (an event the server saw, not a time)
    sent = failures.requests
    assert len(sent) == 2 * len(calls)
    # the prefix cache is emptied once, between the warm-up and the timed pass (the step's rollouts follow a
    # weight sync, which empties it)
    assert failures.cache_resets == [len(calls)] and ceiling["prefix_cache"] == "emptied before the timed pass"
    shape = ceiling["calls"]
    # how the burst filled its time (reported, not judged here: all in flight is max_in_flight above)
    assert shape["mean_in_flight"] > 0 and shape["ramp_s"] >= 0 and shape["drain_s"] >= 0
    expected = sorted((c["messages"][0]["content"], c["n"]) for c in calls) * 2
    assert sorted((b["messages"][0]["content"], b["n"]) for b in sent) == sorted(expected)
    for body in sent:
        assert (body["model"], body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (
            "failure-double",
            0.7,
            0.9,
            20,
            33,
        )
    failures.reset(api_key="bench-key")
    warm = rsft_step.server_replay(failures.url, "failure-double", calls[:2], api_key="bench-key", cold_cache=False)
    assert failures.cache_resets == [] and warm["prefix_cache"].startswith("warm")
    failures.reset(api_key="bench-key")
    with pytest.raises(InferenceError, match="401"):
        rsft_step.server_replay(failures.url, "failure-double", calls[:1], api_key="wrong")


def test_burst_shape_tells_a_trickle_from_a_burst():
    rsft_step = load_benchmark("rsft_step")
    burst = rsft_step.burst_shape([(0.0, 10.0), (0.0, 10.0), (0.1, 10.2), (0.1, 9.9)])
    trickle = rsft_step.burst_shape([(0.0, 4.0), (2.0, 6.0), (4.0, 8.0), (6.0, 10.0)])
    assert burst["ramp_s"] == pytest.approx(0.1) and burst["drain_s"] == pytest.approx(0.3)
    assert burst["mean_in_flight"] == pytest.approx(39.9 / 10.2)
    assert trickle["ramp_s"] == pytest.approx(6.0) and trickle["mean_in_flight"] == pytest.approx(1.6)
    assert rsft_step.burst_shape([]) == {"ramp_s": 0.0, "drain_s": 0.0, "mean_in_flight": 0.0}


def test_rsft_step_records_each_call_as_it_was_sent():
    """The runtime appends the reply to the very message list it sent; a replay of the recorded list would send
    the reply back as prompt (on the H200 this overflowed the context: 513 prompt tokens for a 64-token
    prompt). The recorded call keeps the messages as they were at the call."""
    import asyncio
    from types import SimpleNamespace

    rsft_step = load_benchmark("rsft_step")

    class Client:  # the wrapped method's shape: chat(messages, sampling, n, tools)
        async def chat(self, messages, sampling, n=1, tools=None):
            return SimpleNamespace(completion_tokens=2, completions=[SimpleNamespace(finish_reason="stop")])

    timers, calls = rsft_step.Timers(rsft_step.Timeline()), []
    timers.wrap_chat(Client, calls)
    try:
        messages = [{"role": "user", "content": "Repeat the digit 3."}]
        asyncio.run(Client().chat(messages, None, 1))
        messages.append({"role": "assistant", "content": "<answer>3</answer>"})
    finally:
        timers.restore()
    assert [c["messages"] for c in calls] == [[{"role": "user", "content": "Repeat the digit 3."}]]


def test_colocated_step_passes_rsft_step_options_through():
    colocated_step = load_benchmark("colocated_step")
    rest_in = [
        "--steps",
        "3",
        "--prompts",
        "256",
        "--reply-tokens",
        "480",
        "--max-tokens",
        "512",
        "--ceiling",
        "server",
    ]
    _, args, rest = colocated_step.parse(
        ["--arms", "separate", "--separate-on-one-gpu", *rest_in, "--json", "a.json", "--weight-sync", "cudaIpc"]
    )
    assert rest == rest_in and args.arms == "separate" and args.separate_on_one_gpu and str(args.json) == "a.json"
    assert args.weight_sync == "cudaIpc"  # the colocated arm's, not rsft_step's
    assert colocated_step.parse([])[1].weight_sync == "auto"
    # and rsft_step takes them (its --vllm check aside)
    rsft_step = load_benchmark("rsft_step")
    parsed = rsft_step.parse(rest)
    assert (parsed.steps, parsed.prompts, parsed.reply_tokens, parsed.max_tokens) == (3, 256, 480, 512)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_checkpoint_async_times_both_writers_and_reads_back_the_snapshot(tmp_path):
    out = tmp_path / "ckpt.json"
    run_script("checkpoint_async.py", "--smoke", "--dir", str(tmp_path), "--json", str(out), timeout_s=280)
    report = json.loads(out.read_text())
    assert [r["variant"] for r in report["results"]] == ["sync", "async"]
    for r in report["results"]:
        assert len(r["blocked_s"]) == len(r["write_s"]) == 2 and all(s > 0 for s in r["write_s"])
        assert r["parameters"] > 0
    # each checkpoint read back is the state at its save, not the one after the updates that followed
    assert all(r["written_equals_snapshot"] is True for r in report["results"])
    assert report["compare"]["written_equals_snapshot"] is True


@pytest.mark.timeout(200)
def test_sync_write_times_both_writers_and_they_write_the_same_folder(tmp_path):
    out = tmp_path / "sync_write.json"
    run_script("sync_write.py", "--smoke", "--dir", str(tmp_path), "--json", str(out), timeout_s=180)
    report = json.loads(out.read_text())
    assert len(report["old_s"]) == len(report["new_s"]) == 3 and all(s > 0 for s in report["old_s"] + report["new_s"])
    # each slot folder written whole once, then only its weights file
    assert report["new_kinds"] == ["whole", "whole", "weights"]
    assert report["same_files"] is report["same_tensor_names"] is report["equal_tensors"] is True
    assert report["parameters"] > 0 and report["weights_bytes"] > 0


@pytest.mark.timeout(300)
def test_rollout_burst_compares_each_runtime_with_a_replay_of_its_own_calls(tmp_path):
    """The burst benchmark runs both samplers against the loopback server: the old one sends a request per
    rollout through one harness process, HarnessSampler one n=rollouts request per prompt through its pool,
    and each replay sends exactly the calls its runtime made."""
    out = tmp_path / "burst.json"
    run_script(
        "rollout_burst.py", "--prompts", "4", "--rollouts", "3", "--latency-ms", "100", "--json", str(out),
        timeout_s=240,
    )  # fmt: skip
    report = json.loads(out.read_text())
    before, after = report["rows"]
    assert (before["requests"], before["completions"], before["harness_processes"]) == (12, 12, 1)
    assert (after["requests"], after["completions"]) == (4, 12) and after["harness_processes"] >= 1
    for row in (before, after):
        replay = row["replay"]
        assert (replay["requests"], replay["completions"]) == (row["requests"], row["completions"])
        assert row["span_s"] >= 0.1 and replay["span_s"] >= 0.1  # each request takes the server's 100 ms
        assert row["span_ratio"] == pytest.approx(replay["span_s"] / row["span_s"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gc_freeze_runs_the_step_with_and_without_the_workloads_freeze(tmp_path):
    out = tmp_path / "gc.json"
    run_script("gc_freeze.py", "--rounds", "1", "--json", str(out), "--", "--smoke", timeout_s=280)
    report = json.loads(out.read_text())
    assert report["collector"] == {"frozen": "frozen", "not frozen": "left alone"}
    for arm in ("frozen", "not frozen"):
        (step,) = report["ordinary_steps"][arm]  # the smoke run's two steps: the last stands in
        assert step["step"] == 2 and 0 <= step["gc_full_s"] <= step["gc_pause_s"] < step["wall_s"]
        assert report["medians"][arm]["wall_s"] == step["wall_s"]
    assert report["wall_not_frozen_over_frozen"] > 0


def test_collation_benchmark_encodes_the_same_sequences_with_fewer_renders(tmp_path):
    out = tmp_path / "collation.json"
    run_script("collation.py", "--prompts", "4", "--kept", "3", "--reply-tokens", "8", "--repeats", "1", "--json",
               str(out), timeout_s=120)  # fmt: skip
    report = json.loads(out.read_text())
    assert report["same"] is True and report["trajectories"] == 12
    # one by one: context + turn per trajectory; shared or as a step: each prompt's context once
    rows = report["rows"]
    assert rows["one by one"]["renders"] == 24 and rows["as a step"]["renders"] == 4 + 12
    assert rows["shared renders"]["renders"] == 4 + 12
    # tokenised one text at a time, except as a step: all the step's texts in one batched call
    assert rows["one by one"]["tokenizer_calls"] == 24 and rows["shared renders"]["tokenizer_calls"] == 4 + 12
    assert rows["as a step"]["tokenizer_calls"] == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_operator_bench_gives_the_operator_cores_of_its_own(tmp_path):
    """``--operator-cpus``: the operator's every thread on the cores named, the emulator and the driver on the others
    (as on a cluster, where the API server does not share the operator's cores); a request that leaves them none is
    refused before anything starts."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to keep apart")
    out = tmp_path / "pinned.json"
    run_script(
        "operator_bench.py",
        *("--runs", "2", "--transitions", "2", "--steady", "1", "--idle-s", "1"),
        *("--operator-cpus", str(cores[0]), "--jobs-never-start", "--out", str(out)),
        timeout_s=240,
    )
    report = json.loads(out.read_text())
    # (and the set-up before the Job controller's stand-in: no Job started, so none marked started by the operator)
    assert report["job_controller"] == "never starts a Job (--jobs-never-start)"
    assert (
        report["jobs"]["made"] > 0
        and report["jobs"]["started"] == report["jobs"]["marked_started_by_the_operator"] == 0
    )
    host = report["host"]
    assert host["pinned"] == {"operator": [cores[0]], "emulator_and_driver": cores[1:]}
    # the creation burst's target left the operator its own core over the window, at most (one interpreter lock)
    budget = report["creation_burst"]["target_budget"]
    assert budget["cores"] == len(cores) and budget["operator_allowed_cpu_s"] == pytest.approx(budget["window_s"])
    assert host["operator_threads_cpus"] == [cores[0]], "every thread of the operator, read back from each"
    refused = run_script("operator_bench.py", "--operator-cpus", ",".join(map(str, cores)), returncode=2)
    assert "leaving one at least" in refused.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_operator_bench_runs_five_runs_through_every_section(tmp_path):
    # the operator benchmark as CI can afford it (5 runs): it runs at HEAD, every section reports, and no run
    # starts a prepare Job (split sizes come from the domain, in each run's own store)
    out = tmp_path / "operator.json"
    run_script(
        "operator_bench.py",
        *("--runs", "5", "--transitions", "4", "--steady", "3", "--history", "2", "--out", str(out)),
        timeout_s=240,
    )
    report = json.loads(out.read_text())
    assert report["prepare_jobs"] == 0 and report["runs"] == 6
    # two more rounds of every run's child finishing: each of the 5 runs holds its first Job, the one after it and two
    # more (and its next), beside the reaction run's
    assert report["history"]["rounds"] == 2 and report["history"]["jobs"] >= 5 * 4 + 3
    assert report["history"]["reconciles"] >= 10 and report["history"]["operator_rss_mb"] > 0
    assert report["emulator"] == "own process"  # as on a cluster: the API server's CPU is neither client's
    assert report["store"] == "a local folder"
    host = report["host"]
    assert host["pinned"] is None and host["operator_threads_cpus"] == sorted(os.sched_getaffinity(0))
    assert report["reaction_1_run_s"]["n"] == 4 and report["steady"]["reaction_s"]["n"] == 3
    # the Job controller's stand-in started every Job (startTime and active, then ready) before its workload ended it,
    # and the operator saw them run: its started mark, a patch a Job on a cluster, is in what was measured
    assert report["job_controller"].startswith("starts each Job")
    jobs = report["jobs"]
    assert jobs["started"] == jobs["made"] >= 5 * 4 + 3 and jobs["marked_started_by_the_operator"] >= 5
    # a transition: the served checkpoint's reconcile and the next Job's, and those its start and its readiness woke
    steady = report["steady"]
    assert steady["reconciles_per_transition"] > 2
    assert steady["cpu_per_transition_s"] == pytest.approx(
        steady["cpu_per_reconcile_mean_s"] * steady["reconciles_per_transition"]
    )
    for section in ("creation_burst", "finish_burst", "steady", "idle"):
        assert report[section]["reconciles"] >= 3, section  # idle: each run's progress poll (15 s) at least
        assert report[section]["cpu_per_reconcile_mean_s"] > 0, section
        assert report[section]["process_cpu_s"] >= report[section]["cpu_per_reconcile_mean_s"], section
    for section in ("creation_burst", "finish_burst"):
        assert report[section]["per_run_s"]["n"] == 5, section
        # each run's next Job is the operator's own create; the emulator's and the driver's CPU are reported apart
        assert report[section]["api_requests"]["operator"]["POST"] >= 5, section
        assert report[section]["operator_requests_per_reconcile"] > 0, section
        assert report[section]["emulator_cpu_s"] >= 0 and report[section]["driver_cpu_s"] >= 0, section
        assert report[section]["store_cpu_s"] == 0, "a folder store: no S3 server"
        # the machine's CPU in the burst, and the shortest the burst could have lasted with it
        b = report[section]
        assert b["machine_cpu_s"] == pytest.approx(b["process_cpu_s"] + b["emulator_cpu_s"] + b["driver_cpu_s"])
        # (the CPU figures are counted in clock ticks of 10 ms a process: a short burst may round up by a few)
        assert 0 < b["cpu_bound_s"] <= b["wall_s"] + 0.05 and b["busy_share"] > 0, section
        # each run's Job is created (the API server's time) before the driver's poll can see it
        exact, seen = report[section]["per_run_s"], report[section]["per_run_seen_s"]
        assert exact["n"] == seen["n"] == 5 and 0 < exact["max"] <= seen["max"], section
        assert exact["median"] <= seen["median"], section
    # what the creation burst's target left the operator on this machine: the window the runs' creation and the target
    # make, less what the emulator and the driver spent in it (each on one interpreter lock, as the operator is)
    budget, burst = report["creation_burst"]["target_budget"], report["creation_burst"]
    assert budget["window_s"] == pytest.approx(report["create_s"] + 1.0)
    assert budget["others_cpu_s"] == pytest.approx(burst["emulator_cpu_s"] + burst["driver_cpu_s"])
    cores = len(os.sched_getaffinity(0))
    left = min(cores * budget["window_s"] - budget["others_cpu_s"], budget["window_s"])
    assert budget["operator_allowed_cpu_s"] == pytest.approx(max(0.0, left))
    assert budget["operator_allowed_per_run_s"] == pytest.approx(budget["operator_allowed_cpu_s"] / 5)
    assert budget["operator_cpu_per_run_s"] == pytest.approx(burst["process_cpu_s"] / 5)
    assert budget["reachable"] == (budget["others_fit"] and burst["process_cpu_s"] <= budget["operator_allowed_cpu_s"])
    # the operator's whole CPU, what falls between the sections included
    assert report["operator_cpu_total_s"] >= sum(report[s]["process_cpu_s"] for s in ("creation_burst", "steady"))
    # reactions by transition: the reaction run's whole cycle (its first Job the evaluation at step 0), and the
    # loaded runs' one: each finishes its fourth Job (the finish burst and the two rounds of history made three)
    alone, present = report["reaction_1_run_by_transition"], report["steady"]["reaction_by_transition"]
    assert set(alone) == {"eval -> weight", "weight -> eval", "eval -> harness", "harness -> eval"}
    assert all(s["n"] == 1 for s in alone.values()) and set(present) == {"harness -> eval"}
    assert present["harness -> eval"]["n"] == 3
    same = report["targets"]["reaction_200_p95_over_1_run_p95_same_transition"]
    assert same["by_transition"] == {
        "harness -> eval": pytest.approx(present["harness -> eval"]["p95"] / alone["harness -> eval"]["p95"])
    }
    assert same["measured"] == pytest.approx(same["by_transition"]["harness -> eval"])
    assert set(report["targets"]) == {
        "reaction_200_p95_over_1_run_p95",
        "reaction_200_p95_over_1_run_p95_same_transition",
        "reaction_max_s",
        "burst_p99_incl_wait_s",
        "steady_cpu_per_reconcile_s",
        "idle_cpu_per_reconcile_s",
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_operator_bench_runs_its_runs_on_s3_with_their_own_secret(tmp_path):
    """``--store s3``: the runs' store on SeaweedFS on loopback, each run naming its credentials Secret (the operator has
    no store keys of its own), so the operator's store requests are an S3 client's; the server's CPU is reported."""
    out = tmp_path / "s3.json"
    run_script(
        "operator_bench.py",
        *("--runs", "2", "--transitions", "4", "--steady", "2", "--idle-s", "1", "--store", "s3", "--out", str(out)),
        timeout_s=240,
    )
    report = json.loads(out.read_text())
    assert report["store"].startswith("S3") and report["prepare_jobs"] == 0
    assert report["jobs"]["started"] == report["jobs"]["made"] > 0
    assert report["reaction_1_run_s"]["n"] == 4 and report["steady"]["reaction_s"]["n"] == 2
    for section in ("creation_burst", "finish_burst"):
        b = report[section]
        assert b["per_run_s"]["n"] == 2, section  # every run reached its next Job through its store on S3
        assert b["store_cpu_s"] > 0, "the S3 server served the section's reads and writes"
        assert b["machine_cpu_s"] == pytest.approx(
            b["process_cpu_s"] + b["emulator_cpu_s"] + b["driver_cpu_s"] + b["store_cpu_s"]
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reconcile_cpu_plays_the_same_run_on_s3(tmp_path):
    # the same run played to its end with its store on S3 (SeaweedFS, the run's own Secret): every transition timed
    folder, s3 = tmp_path / "folder.json", tmp_path / "s3.json"
    run_script("reconcile_cpu.py", "--runs", "1", "--out", str(folder), timeout_s=120)
    run_script("reconcile_cpu.py", "--runs", "1", "--store", "s3", "--out", str(s3), timeout_s=180)
    on_folder, on_s3 = json.loads(folder.read_text()), json.loads(s3.read_text())
    assert on_folder["store"] == "folder" and on_s3["store"] == "s3"
    assert on_s3["per_kind"]["finish"]["n"] == on_folder["per_kind"]["finish"]["n"] >= 3, "the same schedule"
    assert on_s3["all"]["n"] == on_folder["all"]["n"]


def test_reconcile_cpu_times_each_kind_of_reconcile_of_a_whole_run(tmp_path):
    # one run played to its end by hand: every transition after the first timed three times, each kind reported
    out = tmp_path / "reconcile.json"
    run_script("reconcile_cpu.py", "--runs", "1", "--out", str(out), timeout_s=120)
    report = json.loads(out.read_text())
    kinds = report["per_kind"]
    assert set(kinds) == {"create", "finish", "running", "started", "noop"}
    assert kinds["finish"]["n"] == kinds["running"]["n"] == kinds["started"]["n"] == kinds["noop"]["n"] >= 3
    # a new run's reconciles until its first Job: one figure a run, more than any one transition's
    assert kinds["create"]["n"] == 1 and kinds["create"]["min_s"] > kinds["noop"]["min_s"]
    assert (
        report["all"]["n"]
        == 4 * kinds["finish"]["n"]
        == sum(len(report["raw_s"][k]) for k in ("finish", "running", "started", "noop"))
    )
    # the reconcile that reads a finished child and makes the next one does more than one that finds nothing new
    assert kinds["finish"]["median_s"] > kinds["noop"]["min_s"] > 0
    # the same reconciles by transition: every one of them counted once, under the kinds of the Jobs it went between
    by_transition = report["per_transition"]
    assert "weight -> eval" in by_transition, by_transition.keys()
    for kind in ("finish", "running", "started", "noop"):
        assert sum(t[kind]["n"] for t in by_transition.values()) == kinds[kind]["n"], kind
    assert all(" -> " in name for name in by_transition)


def test_kube_transport_times_every_variant_of_the_same_request(tmp_path):
    # each variant sent the same PATCH and got the ConfigMap back (checked by the script), every round timed
    out = tmp_path / "transport.json"
    run_script("kube_transport.py", "--requests", "20", "--rounds", "2", "--out", str(out), timeout_s=120)
    report = json.loads(out.read_text())
    variants = {"sdk_urllib3_pool", "http_client", "transport", "kube_client", "httpx"}
    assert set(report["per_variant"]) == set(report["raw_s"]) == variants
    assert all(len(rounds) == 2 and min(rounds) > 0 for rounds in report["raw_s"].values())
    assert report["per_variant"]["sdk_urllib3_pool"]["vs_sdk_urllib3_pool"] == 1.0


def test_metrics_read_times_the_three_readings_of_each_length(tmp_path):
    # the script itself checks that the three readings returned the same lines, each as many as the file holds
    out = tmp_path / "metrics_read.json"
    run_script("metrics_read.py", "--lines", "3,30", "--repeats", "3", "--out", str(out), timeout_s=120)
    report = json.loads(out.read_text())
    assert [row["lines"] for row in report["per_length"]] == [3, 30]
    for row in report["per_length"]:
        assert set(row["median_s"]) == {"whole", "one_new", "none_new"}
        assert all(len(v) == 3 and min(v) >= 0 for v in row["raw_s"].values())
        assert row["over_whole"]["whole"] == 1.0


def test_metrics_read_refuses_a_length_it_cannot_time():
    done = run_script("metrics_read.py", "--lines", "ten", returncode=2)
    assert "--lines: 'ten' is not a comma-separated list of whole numbers" in done.stderr


def test_demo_cost_records_each_run_and_stops_at_a_failed_one(tmp_path):
    # the plumbing, with commands in place of `make demo` (the demo itself: tests/component/test_examples.py)
    ok, failed = tmp_path / "ok.json", tmp_path / "failed.json"
    quiet = f"{sys.executable} -c 'import sys; sys.exit(0)'"
    run_script("demo_cost.py", "--command", quiet, "--repeats", "2", "--keep-model", "--stores", str(tmp_path),
               "--json", str(ok))  # fmt: skip
    report = json.loads(ok.read_text())
    assert [r["returncode"] for r in report["runs"]] == [0, 0]
    assert all(r["wall_s"] >= 0 and r["evaluations"] == {} and r["best_mean_at_k"] is None for r in report["runs"])
    loud = f"{sys.executable} -c 'import sys; print(\"no model\"); sys.exit(3)'"
    with pytest.raises(AssertionError, match="demo_cost.py failed"):
        run_script("demo_cost.py", "--command", loud, "--repeats", "2", "--keep-model", "--stores", str(tmp_path),
                   "--json", str(failed))  # fmt: skip
    runs = json.loads(failed.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["returncode"] == 3 and "no model" in runs[0]["output_tail"]


def test_demo_cost_names_the_demos_processes():
    label = load_benchmark("demo_cost")._label
    workload = ".venv/bin/python -m whale.workloads eval --store file:///s --run r --phase eval-c00-s000000-start"
    assert label(workload) == "eval eval-c00-s000000-start"
    assert label(".venv/bin/python -m synthetic.tiny_model .whale/models/synthetic-tiny") == "tiny model build"
    assert label("/x/.venv/bin/python .venv/bin/whale run demo.yaml --store s") == "whale run"
    assert label("/x/python -I -S /x/whale/runner/supervise.py --watch-fd 4 -- " + workload) is None  # not twice


@pytest.mark.timeout(300)
def test_compare_time_benchmark_compares_four_conditions(tmp_path):
    """benchmarks/compare_time.py: a store of the four conditions, `whale compare` over it, every pair compared."""
    out = tmp_path / "compare.json"
    run_script(
        "compare_time.py", "--seeds", "1", "--steps", "14", "--items", "20", "--repeats", "1", "--json", str(out)
    )
    result = json.loads(out.read_text())
    assert (result["runs"], result["groups"], result["pairs"]) == (4, 4, 6)
    assert len(result["wallSeconds"]) == 1 and result["medianSeconds"] > 0


@pytest.mark.timeout(200)
def test_egress_proxy_benchmark_carries_every_byte_both_ways_in_both_networks(tmp_path):
    """The proxy's overhead benchmark: the same program in a sandbox with the host's network and behind the egress
    proxy; each connection it timed was opened and each bulk transfer arrived whole (the script checks the bytes)."""
    out = tmp_path / "egress.json"
    run_script("egress_proxy.py", "--smoke", "--json", str(out), timeout_s=180)
    report = json.loads(out.read_text())
    assert [r["network"] for r in report["results"]] == ["host", "proxy"]
    for r in report["results"]:
        assert len(r["setup_s"]) == r["connections"] == 10 and all(s > 0 for s in r["setup_s"])
        assert r["bytes"] == 4 << 20 and r["download_mib_s"] > 0 and r["upload_mib_s"] > 0
    assert set(report["compare"]) == {"setup_added_ms", "download_ratio", "upload_ratio"}


def test_save_hub_form_writes_what_the_train_workload_keeps_and_vllm_needs(tmp_path):
    """The GPU benchmarks' paper-shape models are saved in the hub's multimodal form (vLLM 0.24 serves only that
    form): the folder carries the hub's config and processor config, and the train workload's loader sees the form
    (the vision tower as untrained tensors, the processor config to copy into each checkpoint)."""
    import torch

    from tests.fixtures.models import HUB_PREPROCESSOR_CONFIG, build_tiny_qwen35, build_tiny_tokenizer
    from whale.rsft.hub_form import hub_form_of
    from whale.rsft.sync import saved_names

    bench = load_benchmark("sft_throughput")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen35(len(tokenizer))
    bench.save_hub_form(model, tokenizer, tmp_path / "hub", dtype=torch.float32)

    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["text_config"]["hidden_size"] == model.config.hidden_size
    assert json.loads((tmp_path / "hub" / "preprocessor_config.json").read_text()) == HUB_PREPROCESSOR_CONFIG
    from transformers import Qwen3_5ForCausalLM

    loaded = Qwen3_5ForCausalLM.from_pretrained(tmp_path / "hub")  # the language model, as the train workload loads it
    form = hub_form_of(tmp_path / "hub", loaded, saved_names(loaded, loaded.state_dict()).values())
    assert form is not None
    assert set(form.processor) == {"preprocessor_config.json"}
    assert form.untrained and all(name.startswith("model.visual.") for name in form.untrained)


def test_the_compile_counts_say_what_torch_compile_did():
    """An over-budget record's ``compiled`` (:func:`compiled_since` the trainer's start): here one function with a
    graph break, compiled with dynamo's eager backend, shows the frames begun and finished, the graphs out of the
    compiler and the break; a second call with the same shapes compiles nothing more."""
    import torch

    with mock.patch.dict(os.environ):  # the script sets the Hub's offline switches as it loads: not for later tests
        bench = load_benchmark("sft_vs_trl")

    def broken_in_two(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    compiled = torch.compile(broken_in_two, backend="eager")
    before = bench.compile_counts()
    x = torch.ones(3)
    assert torch.equal(compiled(x), x * 2 + 1)
    grew = bench.compiled_since(before)
    assert grew["graph_breaks"] == 1 and grew["unique_graphs"] == 2
    assert grew["frames_started"] >= 1 and grew["frames_done"] >= 1
    after_first = bench.compile_counts()
    compiled(x)
    assert bench.compiled_since(after_first) == dict.fromkeys(bench.COMPILE_COUNTS, 0)
