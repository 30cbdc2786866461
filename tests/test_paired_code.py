"""experiments/paired_code.py: runs paired by number, samples by prompt, ratios taken inside each process."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paired_code", REPO / "experiments" / "paired_code.py")
paired_code = sys.modules["paired_code"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired_code)


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def harness_run(folder: Path, ar: list[float], spec_tps: list[float]) -> None:
    ids = [f"p{i}" for i in range(len(ar))]
    write(folder / "ar" / "samples.jsonl", [{"prompt_id": p, "method": "ar", "tokens_per_s": a, "ar_tokens_per_s": a}
                                            for p, a in zip(ids, ar)])
    write(folder / "sparsespec" / "samples.jsonl", [{"prompt_id": p, "method": "sparsespec", "tokens_per_s": s,
                                                     "ar_tokens_per_s": a} for p, a, s in zip(ids, ar, spec_tps)])


def test_harness_runs_pair_by_number_and_prompt(tmp_path):
    harness_run(tmp_path / "old_1", ar=[10, 10], spec_tps=[12, 15])
    harness_run(tmp_path / "new_1", ar=[20, 20], spec_tps=[30, 30])     # the machine twice as fast
    harness_run(tmp_path / "old_2", ar=[10, 10], spec_tps=[12, 15])
    harness_run(tmp_path / "new_3", ar=[1, 1], spec_tps=[1, 1])         # no old_3: left out
    (record,) = paired_code.compare(paired_code.runs(tmp_path))
    assert record["method"] == "sparsespec" and record["n"] == 2
    assert record["speedup"].mean == pytest.approx(math.sqrt((1.5 / 1.2) * (1.5 / 1.5)))
    assert record["ar_tokens_per_s"].mean == pytest.approx(2.0)
    assert record["old"].mean == pytest.approx(math.sqrt(1.2 * 1.5)) and record["new"].mean == pytest.approx(1.5)
    assert "later_calls" not in record


def test_library_cases_give_the_later_calls_apart(tmp_path):
    for run, ratio in (("old_1", 1.0), ("new_1", 2.0)):
        write(tmp_path / run / "library_quiet_64" / "samples.jsonl",
              [{"prompt_id": f"p{i}", "ar_tokens_per_s": 10.0, "sparsespec_tokens_per_s": 10.0 * ratio ** i}
               for i in range(3)])
    (record,) = paired_code.compare(paired_code.runs(tmp_path))
    assert record["method"] == "library_quiet_64: sparsespec" and record["n"] == 3
    assert record["later_calls"].mean == pytest.approx(math.sqrt(2.0 * 4.0)) and record["later_calls"].n == 2
    assert record["new_later_calls"].mean == pytest.approx(math.sqrt(2.0 * 4.0))     # old ran 1.0x throughout


def test_a_folder_without_pairs_is_one_line(tmp_path, capsys):
    harness_run(tmp_path / "old_1", ar=[10], spec_tps=[12])
    with pytest.raises(SystemExit, match="holds no old_N and new_N run folders of the same N"):
        paired_code.main([str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        paired_code.main([str(tmp_path / "missing")])
    assert stop.value.code == 2 and "is not a folder" in capsys.readouterr().err


def test_old_and_new_named_pair_in_order(tmp_path, capsys):
    harness_run(tmp_path / "before", ar=[10, 10], spec_tps=[12, 15])
    harness_run(tmp_path / "after", ar=[20, 20], spec_tps=[30, 30])
    assert paired_code.main(["--old", str(tmp_path / "before"), "--new", str(tmp_path / "after")]) == 0
    assert f"new / old speed-up over AR {math.sqrt(1.25):.3f}x" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        paired_code.main(["--old", str(tmp_path / "before")])
    assert stop.value.code == 2 and "1 --old but 0 --new" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        paired_code.main([str(tmp_path), "--old", str(tmp_path / "before"), "--new", str(tmp_path / "after")])
    assert stop.value.code == 2 and "not both" in capsys.readouterr().err
