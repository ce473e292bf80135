"""translate, serve and run's decoding choose their CPU threads as training does: --threads N
(train.threads for run) as given, 0 only the cores other processes leave free, the load read
in the background while the command starts."""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from nmtkit.errors import ConfigError
from nmtkit.runtime import threads
from support.cli import cli_in_process


@pytest.fixture
def four_cores(monkeypatch):
    """A 4-core process on a machine whose load each test sets; PyTorch's default is 4 threads."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def load_of(monkeypatch, busy: float) -> list[str]:
    """Make the load reading say ``busy`` cores; returns the names of the threads that read it."""
    readers = []

    def reading(cpus, seconds=threads.SAMPLE_SECONDS):
        assert cpus == {0, 1, 2, 3}
        readers.append(threading.current_thread().name)
        return busy

    monkeypatch.setattr(threads, "busy_cores_of_others", reading)
    return readers


def translate(monkeypatch, capsys, model_dir, tmp_path, *flags: str) -> tuple[int, str, str]:
    source = tmp_path / "in.txt"
    source.write_text("the cat sat\na dog ran\n", encoding="utf-8")
    return cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), "-i", str(source), "--device",
                          "cpu", "-b", "2", "--max-len-b", "4", *flags)


@pytest.mark.parametrize("busy, expected", [(0.0, 4), (0.4, 4), (1.0, 3), (2.7, 1), (7.5, 1)])
def test_translate_auto_leaves_the_busy_cores_to_their_owners(monkeypatch, capsys, four_cores, model_dir, tmp_path,
                                                              busy, expected):
    readers = load_of(monkeypatch, busy)
    code, out, err = translate(monkeypatch, capsys, model_dir, tmp_path)
    assert code == 0, err
    assert torch.get_num_threads() == expected
    assert len(out.splitlines()) == 2
    # read once, in the background thread the command starts before torch and the model load
    assert readers == ["nmtkit-load-reading"]
    note = (f"other processes keep {busy:.1f} of 4 cores busy: translating with {expected} thread(s) instead of 4 "
            f"(--threads sets the number)")
    assert (note in " ".join(err.split())) == (expected != 4), err  # the console wraps long lines


def test_translate_output_does_not_depend_on_the_thread_count(monkeypatch, capsys, four_cores, model_dir, tmp_path):
    load_of(monkeypatch, 2.7)
    _, busy_out, _ = translate(monkeypatch, capsys, model_dir, tmp_path)
    torch.set_num_threads(4)
    _, explicit_out, _ = translate(monkeypatch, capsys, model_dir, tmp_path, "--threads", "4")
    assert torch.get_num_threads() == 4 and busy_out == explicit_out and busy_out.count("\n") == 2


@pytest.mark.parametrize("flag, expected", [("2", 2), ("1", 1), ("3", 3)])
def test_translate_applies_an_explicit_count_without_reading_the_load(monkeypatch, capsys, four_cores, model_dir,
                                                                      tmp_path, flag, expected):
    readers = load_of(monkeypatch, 3.0)
    code, _, err = translate(monkeypatch, capsys, model_dir, tmp_path, "--threads", flag)
    assert code == 0, err
    assert torch.get_num_threads() == expected and readers == [] and "cores busy" not in err


def test_translate_auto_respects_omp_num_threads(monkeypatch, capsys, four_cores, model_dir, tmp_path):
    readers = load_of(monkeypatch, 3.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    code, _, err = translate(monkeypatch, capsys, model_dir, tmp_path)
    assert code == 0, err
    assert torch.get_num_threads() == 4 and readers == []


def test_translate_refuses_a_negative_count(monkeypatch, capsys, model_dir, tmp_path):
    code, out, err = translate(monkeypatch, capsys, model_dir, tmp_path, "--threads", "-1")
    assert (code, out, err) == (2, "", "nmtkit: error: --threads must be in [0, 4096], got -1\n")


@pytest.mark.parametrize("flags, busy, expected", [((), 1.0, 3), ((), 0.0, 4), (("--threads", "2"), 3.0, 2)])
def test_serve_loads_its_model_on_the_chosen_threads(monkeypatch, capsys, four_cores, model_dir, flags, busy,
                                                     expected):
    import nmtkit.translate_files

    readers = load_of(monkeypatch, busy)
    seen = []

    def open_engine(model_dirs, options):  # where the server loads its model: stop it there
        seen.append(torch.get_num_threads())
        raise ConfigError("stopped before loading")

    monkeypatch.setattr(nmtkit.translate_files, "open_engine", open_engine)
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0", *flags)
    assert (code, err.splitlines()[-1]) == (2, "nmtkit: error: stopped before loading")
    assert seen == [expected]
    assert readers == ([] if flags else ["nmtkit-load-reading"])


class Notes:
    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("setting, busy, expected", [(0, 1.0, 3), (0, 0.0, 4), (2, 3.0, 2)])
def test_run_decodes_on_the_threads_train_threads_chooses_then(monkeypatch, four_cores, model_dir, setting, busy,
                                                               expected):
    import nmtkit.pipeline

    load_of(monkeypatch, busy)
    monkeypatch.setattr(nmtkit.pipeline, "open_translator", lambda *args: torch.get_num_threads())
    cfg = SimpleNamespace(train=SimpleNamespace(threads=setting))
    notes = Notes()
    assert nmtkit.pipeline.decoding_translator(cfg, model_dir, {}, None, notes) == expected
    assert notes.lines == ([f"other processes keep {busy:.1f} of 4 cores busy: translating with {expected} thread(s) "
                            f"instead of 4 (train.threads sets the number)"] if expected != 4 and setting == 0 else [])


def test_decoding_after_training_on_a_busy_machine_gets_every_core_back_once_idle(monkeypatch, four_cores):
    """run trains with train.threads=0 while the machine is busy (1 thread), then decodes when
    it is idle: auto counts from PyTorch's default (4), not from the 1 thread training used."""
    load_of(monkeypatch, 2.7)
    assert threads.configure_threads(0, Notes()) == 1 == torch.get_num_threads()
    load_of(monkeypatch, 0.0)
    assert threads.configure_threads(0, Notes(), what="translating") == 4 == torch.get_num_threads()
    torch.set_num_threads(2)  # someone else's choice becomes the default auto counts from
    load_of(monkeypatch, 1.0)
    assert threads.configure_threads(0, Notes()) == 2


def test_an_early_reading_is_used_once_and_not_when_stale(monkeypatch, four_cores):
    readers = load_of(monkeypatch, 1.0)
    threads.start_reading(0)
    assert threads.choose_threads(0)[0] == 3 and readers == ["nmtkit-load-reading"]
    assert threads.choose_threads(0)[0] == 3 and readers[1] == threading.current_thread().name
    threads.start_reading(0)
    threads._early[0].busy()
    monkeypatch.setattr(threads._early[0], "started", threads._early[0].started - threads.READING_MAX_AGE_S - 1)
    load_of(monkeypatch, 0.0)
    assert threads.choose_threads(0)[0] == 4  # the stale reading (1 busy core) was not used
    threads.start_reading(5)
    assert threads._early == []


def many_lines(tmp_path, count: int = 12):
    source = tmp_path / "many.txt"
    words = ["the cat sat", "a dog ran", "the dog sat on the cat", "cats", "a cat ran to the dog and sat"]
    source.write_text("".join(words[i % len(words)] + "\n" for i in range(count)), encoding="utf-8")
    return source


def searches_seen(monkeypatch) -> tuple[list[tuple[str, int, int]], list[int]]:
    """Record (thread name, PyTorch threads, lines) of every search call the torch engine makes,
    and the most calls in flight at once (each call lingers a little, so calls meant to overlap do)."""
    from nmtkit.decoding.torch_engine import TorchEngine

    seen, search, lock, flying = [], TorchEngine.search, threading.Lock(), [0, 0]  # now, most

    def recording(self, src, src_mask, **targets):
        with lock:
            flying[0] += 1
            flying[1] = max(flying)
        seen.append((threading.current_thread().name, torch.get_num_threads(), src.size(0)))
        try:
            time.sleep(0.05)
            return search(self, src, src_mask, **targets)
        finally:
            with lock:
                flying[0] -= 1

    monkeypatch.setattr(TorchEngine, "search", recording)
    return seen, flying


@pytest.mark.parametrize("flags, at_once, each", [((), 4, 1), (("--workers", "2"), 2, 2), (("--workers", "1"), 1, 4),
                                                  (("--workers", "3"), 3, 1)])
def test_translate_searches_batches_side_by_side_with_the_same_output(monkeypatch, capsys, four_cores, model_dir,
                                                                      tmp_path, flags, at_once, each):
    source = many_lines(tmp_path)
    common = ["translate", "-m", str(model_dir), "-i", str(source), "--device", "cpu", "-b", "2", "--max-len-b", "4",
              "--threads", "4", "--batch-tokens", "12"]
    code, alone, err = cli_in_process(monkeypatch, capsys, *common, "--workers", "1")
    assert code == 0, err
    seen, flying = searches_seen(monkeypatch)
    code, out, err = cli_in_process(monkeypatch, capsys, *common, *flags)
    assert code == 0, err
    assert out == alone and out.count("\n") == 12
    assert sum(lines for _, _, lines in seen) == 12 and len(seen) > 4  # several batches, every line once
    names = {name for name, _, _ in seen}
    if at_once == 1:
        assert names == {threading.current_thread().name}
    else:
        assert names <= {f"nmtkit-search_{i}" for i in range(at_once)}
    assert flying[1] == at_once  # as many searches at once as asked for, never more
    assert {threads for _, threads, _ in seen} == {each}  # the 4 threads shared among the batches at once
    assert torch.get_num_threads() == 4  # the caller's own count is untouched
    assert not [t for t in threading.enumerate() if t.name.startswith("nmtkit-search")]  # the workers are gone


@pytest.mark.parametrize("threads, workers, tasks, expected", [
    (2, 2, 5, (2, 1)), (2, 0, 5, (1, 2)), (4, 2, 5, (2, 2)), (4, 3, 5, (3, 1)), (8, 8, 3, (3, 2)),
    (2, 2, 1, (1, 2)), (1, 4, 9, (1, 1)), (16, 4, 0, (1, 16))])
def test_batches_at_once_never_exceed_the_batches_or_the_threads(threads, workers, tasks, expected):
    from nmtkit.decoding.parallel import split_threads

    assert split_threads(threads, workers, tasks) == expected


def test_an_error_in_a_batch_searched_beside_others_reaches_the_caller():
    from nmtkit.decoding.parallel import run_side_by_side

    def run(task):
        if task == 3:
            raise ValueError("batch 3 failed")
        return task * 10

    started = []

    def slow(task):
        started.append(task)
        time.sleep(0.02)
        return run(task)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = run_side_by_side(list(range(40)), slow, 2)
        assert [next(results), next(results), next(results)] == [(0, 0), (1, 10), (2, 20)]
        with pytest.raises(ValueError, match="batch 3 failed"):
            next(results)
        assert len(started) < 40  # what had not started when the error came never runs
        assert not [t for t in threading.enumerate() if t.name.startswith("nmtkit-search")]
        assert list(run_side_by_side([1, 2], lambda task: task + 1, 2)) == [(1, 2), (2, 3)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("flags, message", [
    (("--workers", "2", "--sample"), "--workers applies to beam and greedy search: --sample searches one batch at a "
                                     "time (one random stream, drawn in order)"),
    (("--workers", "2", "--compile"), "--workers does not apply with --compile, which searches one batch at a time"),
    (("--workers", "2", "--stream"), "--workers does not apply with --stream, which translates each line alone"),
    (("--workers", "-1"), "--workers must be in [0, 4096], got -1")])
def test_translate_refuses_workers_where_they_cannot_apply(monkeypatch, capsys, model_dir, tmp_path, flags, message):
    source = many_lines(tmp_path, 2)
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), "-i", str(source), *flags)
    assert (code, out, err) == (2, "", f"nmtkit: error: {message}\n")


def test_serve_searches_one_batch_at_a_time(monkeypatch, capsys, model_dir):
    """The server bounds the memory of each search call (--max-search-bytes): calls side by side would
    add up past it."""
    import nmtkit.translate_files

    seen = []

    def open_engine(model_dirs, options):
        seen.append(options.workers)
        raise ConfigError("stopped before loading")

    monkeypatch.setattr(nmtkit.translate_files, "open_engine", open_engine)
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0", "--threads", "2")
    assert (code, seen) == (2, [1]), err


def test_one_worker_is_accepted_wherever_batches_run_one_at_a_time(monkeypatch, capsys, model_dir, tmp_path):
    source = many_lines(tmp_path, 3)
    for flags in (("--sample", "--nbest", "2"), ("--stream",)):
        code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), "-i", str(source),
                                        "--device", "cpu", "--max-len-b", "4", "--workers", "1", *flags)
        assert code == 0 and out.count("\n") == 3 * (2 if "--sample" in flags else 1), err


def test_workers_are_for_the_cpu_only(loaded_tiny, monkeypatch):
    """On a GPU one batch runs at a time (a given --workers is refused before any model loads); on a
    CPU the count is the options', 0 meaning one per thread, and sampling or a compiled decoder take one."""
    import nmtkit.decoding.torch_engine as torch_engine
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.torch_engine import TorchEngine

    item = loaded_tiny

    def engine(device: str, **settings):
        return TorchEngine(item.model, item.src_vocab, item.tgt_vocab, TranslateOptions(**settings), torch.device(device))

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert [engine("cpu").batch_workers, engine("cpu", workers=2).batch_workers] == [3, 2]
        assert engine("cpu", workers=2, sample=True).batch_workers == 1
        assert engine("cpu", workers=2, compile=True).batch_workers == 1
        on_gpu = engine("cpu")
        on_gpu.device = torch.device("cuda")  # as an engine on a GPU holds it
        assert on_gpu.batch_workers == 1
        monkeypatch.setattr(torch_engine, "resolve_device", lambda name: torch.device("cuda"))
        monkeypatch.setattr(torch_engine, "load_models", lambda *args: pytest.fail("a model loaded"))
        assert torch_engine.placement(TranslateOptions(device="cuda", workers=1))[0].type == "cuda"
        with pytest.raises(ConfigError, match="--workers applies to decoding on a CPU: on cuda batches are searched "
                                              "one at a time"):
            TorchEngine.open(["model"], TranslateOptions(device="cuda", workers=2))
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def loaded_tiny(model_dir):
    from nmtkit.modeldir import load_model_dir

    return load_model_dir(model_dir)


def test_an_engine_with_its_own_pool_gets_the_free_cores_without_torch_threads_changing(monkeypatch, four_cores):
    """CTranslate2's count is chosen as PyTorch's would be (the busy cores left to their owners),
    while PyTorch's own pool is not touched."""
    readers = load_of(monkeypatch, 1.0)
    notes = Notes()
    assert threads.configure_threads(0, notes, what="translating", option="--threads", pytorch=False) == 3
    assert torch.get_num_threads() == 4 and readers == [threading.current_thread().name]
    assert notes.lines == ["other processes keep 1.0 of 4 cores busy: translating with 3 thread(s) instead of 4 "
                           "(--threads sets the number)"]
    assert threads.configure_threads(2, notes, what="translating", option="--threads", pytorch=False) == 2


def test_without_torch_the_default_follows_omp_num_threads_then_physical_cores(monkeypatch, tmp_path):
    monkeypatch.delitem(__import__("sys").modules, "torch")  # as in a process that never imported it
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.machine_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    # four logical CPUs, two hyperthreads on each of two cores; CPU 9 has no topology to read
    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert threads.physical_cores({0, 1, 2, 3}, str(tmp_path)) == 2
    assert threads.physical_cores({0, 2, 9}, str(tmp_path)) == 2
    assert threads.machine_threads() >= 1


def test_translating_an_export_chooses_its_threads_after_reading_the_export(monkeypatch, capsys, four_cores,
                                                                          model_dir, tmp_path):
    """The export's threads follow the machine's load, chosen once its vocabularies are read."""
    pytest.importorskip("ctranslate2")
    import nmtkit.ctranslate2.engine as ct2_engine
    from nmtkit.ctranslate2.export import export_ctranslate2

    export = export_ctranslate2(model_dir, tmp_path / "ct2")
    load_of(monkeypatch, 1.0)
    seen, translator = [], ct2_engine.import_ctranslate2().Translator

    def recording(*args, **kwargs):
        seen.append(kwargs["intra_threads"])
        return translator(*args, **kwargs)

    monkeypatch.setattr(ct2_engine.import_ctranslate2(), "Translator", recording)
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(export), "-i",
                                    str(many_lines(tmp_path, 2)), "--max-len-b", "4")
    assert code == 0 and out.count("\n") == 2, err
    assert seen == [3]  # (CTranslate2 sets the OpenMP count it shares with torch in this process: not checked)
    assert "translating with 3 thread(s) instead of 4" in " ".join(err.split())
