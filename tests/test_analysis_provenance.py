"""analysis.figures and analysis.claims accept and refuse the same results (a prompt twice in a cell, a
cell made at several commits), check everything before writing anything, and publish into the docs and
the README only when asked."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import claims
from analysis.figures import main as figures_main
from analysis.load import load_results
from analysis.provenance import cell_provenance

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
SPEED = {"ar": 1.0, "sparsespec": 1.5, "sparsespec_fixed": 1.3, "streaming": 1.1}


def write_run(folder: Path, method: str, commit: str = COMMIT_A, dirty: bool = False, noisy: bool = False,
              ctx: int = 8000, prompts: int = 3) -> None:
    """One benchmark run folder (summary.json + samples.jsonl) with the fields the analysis reads."""
    options = {"k": 4} if method == "sparsespec_fixed" else {}
    samples = []
    for p in range(prompts):
        ar = 10.0 * (1 + 0.1 * p)
        tps = ar * SPEED[method] * (1 + 0.02 * (p - 1)) if method != "ar" else ar
        samples.append({"prompt_id": f"{p:03d}", "tokens_per_s": tps, "ar_tokens_per_s": ar, "speedup_vs_ar": tps / ar,
                        "mean_accepted": 1.0 if method == "ar" else 3.0, "outputs_match_ar": None if method == "ar" else True,
                        "prefill_s": 1.0, "decode_s": 1.0, "rounds": []})
    summary = {"run": {"model": "m", "task": "qa", "ctx": ctx, "method": method, "bench": {"noisy": noisy}},
               "config": {"method": {"name": method, "options": options}}, "metrics": {},
               "env": {"cpu": "Synthetic CPU", "git": {"commit": commit, "dirty": dirty}}}
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def write_cell(root: Path, chunk: str = "chunk", commits: dict | None = None, **kw) -> Path:
    for method in SPEED:
        write_run(root / chunk / "0_m_qa_ctx8000" / method, method, commit=(commits or {}).get(method, COMMIT_A), **kw)
    return root


def published(tmp_path: Path) -> tuple[Path, Path]:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{claims.MARK_BEGIN}\nOLD-BLOCK\n{claims.MARK_END}\n")
    doc = tmp_path / "docs" / "claims.md"
    doc.parent.mkdir()
    doc.write_text("published\n")
    return readme, doc


def test_without_publish_only_the_results_folder_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    readme, doc = published(tmp_path)
    results = write_cell(tmp_path / "mine")
    assert claims.main([str(results), "--no-figures"]) == 0
    assert readme.read_text().count("OLD-BLOCK") == 1 and doc.read_text() == "published\n"
    assert "## Provenance of each cell" in (results / "claims.md").read_text()


def test_publish_rewrites_the_docs_and_the_readme_block(tmp_path):
    readme, doc = published(tmp_path)
    results = write_cell(tmp_path / "matrix")
    assert claims.main([str(results), "--no-figures", "--publish", "--claims", str(doc), "--readme", str(readme)]) == 0
    assert "OLD-BLOCK" not in readme.read_text() and "--publish" in readme.read_text()
    assert doc.read_text().startswith("# The paper's claims")
    assert not (results / "claims.md").exists()


def test_claims_and_readme_paths_without_publish_are_refused(tmp_path, capsys):
    results = write_cell(tmp_path / "mine")
    with pytest.raises(SystemExit) as exit_:
        claims.main([str(results), "--readme", "README.md"])
    assert exit_.value.code == 2 and "--publish" in capsys.readouterr().err


@pytest.mark.parametrize("publish", [False, True])
def test_bad_input_writes_nothing(tmp_path, capsys, publish):
    """A prompt twice in a cell (the cell run in two folders): exit 2 with one line, no figures folder,
    no claims.md, the published files untouched."""
    readme, doc = published(tmp_path)
    results = write_cell(write_cell(tmp_path / "twice", chunk="first"), chunk="second")
    extra = ["--publish", "--claims", str(doc), "--readme", str(readme)] if publish else []
    assert claims.main([str(results), *extra]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "appears in 2 runs" in error
    assert not (results / "figures").exists() and not (results / "claims.md").exists()
    assert readme.read_text().count("OLD-BLOCK") == 1 and doc.read_text() == "published\n"


def test_publish_into_a_readme_without_markers_writes_nothing(tmp_path, capsys):
    readme, doc = published(tmp_path)
    readme.write_text("no block here\n")
    results = write_cell(tmp_path / "matrix")
    with pytest.raises(SystemExit) as exit_:
        claims.main([str(results), "--publish", "--claims", str(doc), "--readme", str(readme)])
    assert exit_.value.code == 2 and "claims:begin" in capsys.readouterr().err
    assert not (results / "figures").exists() and doc.read_text() == "published\n"


def test_figures_refuse_a_prompt_twice_in_a_cell_as_claims_do(tmp_path, capsys):
    results = write_cell(write_cell(tmp_path / "twice", chunk="first"), chunk="second")
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert "appears in 2 runs" in capsys.readouterr().err
    assert not (tmp_path / "fig").exists()


def test_a_cell_made_at_two_commits_is_refused_unless_asked(tmp_path, capsys):
    results = write_cell(tmp_path / "mixed", commits={"streaming": COMMIT_B})
    assert claims.main([str(results), "--no-figures"]) == 2
    assert "2 commits (aaaaaaaa, bbbbbbbb)" in capsys.readouterr().err
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert "--allow-mixed-commits" in capsys.readouterr().err
    assert claims.main([str(results), "--no-figures", "--allow-mixed-commits"]) == 0
    assert "aaaaaaaa, bbbbbbbb" in (results / "claims.md").read_text()


def test_cell_provenance_shows_commit_and_the_dirty_and_noisy_flags(tmp_path):
    write_cell(tmp_path / "r", chunk="clean")
    for method in SPEED:
        write_run(tmp_path / "r" / "flagged" / "0_m_qa_ctx4000" / method, method, commit=COMMIT_B, ctx=4000,
                  dirty=method == "ar", noisy=method == "streaming")
    table = cell_provenance(load_results(tmp_path / "r")).set_index("ctx")
    assert table.loc[8000, ["commit", "dirty tree", "noisy"]].tolist() == ["aaaaaaaa", "no", "no"]
    assert table.loc[4000, ["commit", "dirty tree", "noisy"]].tolist() == ["bbbbbbbb", "yes", "yes"]


def test_a_speed_that_is_not_positive_is_one_line_not_a_traceback(tmp_path, capsys):
    results = write_cell(tmp_path / "zero")
    path = results / "chunk" / "0_m_qa_ctx8000" / "streaming" / "samples.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1].update(tokens_per_s=0.0, speedup_vs_ar=0.0)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert claims.main([str(results), "--no-figures"]) == 2
    assert "tokens_per_s is 0 for prompt 001" in capsys.readouterr().err
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert not (results / "claims.md").exists() and not (tmp_path / "fig").exists()
