"""analysis.figures and analysis.claims accept and refuse the same results (a prompt twice in a cell, a
cell made from several versions of the code), check everything before writing anything, and publish into
the docs and the README only when asked."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import claims, publish
from analysis.figures import main as figures_main
from analysis.load import load_results
from analysis.provenance import PoolingError, cell_provenance, check_poolable, short_commits

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40
CODE_1, CODE_2 = "1" * 40, "2" * 40
SPEED = {"ar": 1.0, "sparsespec": 1.5, "sparsespec_fixed": 1.3, "streaming": 1.1}


def write_run(folder: Path, method: str, commit: str = COMMIT_A, dirty: bool = False, noisy: bool = False,
              ctx: int = 8000, prompts: int = 3, code: str | None = None, code_dirty: bool | None = None,
              options: dict | None = None, sample_codes: list | None = None, ar_path: str | None = None,
              capability: str | None = None, sample_capabilities: list | None = None) -> None:
    """One benchmark run folder (summary.json + samples.jsonl) with the fields the analysis reads; without
    `code` its git state is that of a run made before the code fingerprint was recorded; without `ar_path`
    its AR is that of a run made before AR's attention paths were measured."""
    options = options if options is not None else {"k": 4} if method == "sparsespec_fixed" else {}
    samples = []
    for p in range(prompts):
        ar = 10.0 * (1 + 0.1 * p)
        tps = ar * SPEED[method] * (1 + 0.02 * (p - 1)) if method != "ar" else ar
        samples.append({"prompt_id": f"{p:03d}", "tokens_per_s": tps, "ar_tokens_per_s": ar, "speedup_vs_ar": tps / ar,
                        "mean_accepted": 1.0 if method == "ar" else 3.0, "outputs_match_ar": None if method == "ar" else True,
                        "prefill_s": 1.0, "decode_s": 1.0, "rounds": [],
                        **({"code": sample_codes[p]} if sample_codes else {}),
                        **({"cpu": "Synthetic CPU", "cpu_capability": sample_capabilities[p]}
                           if sample_capabilities else {})})
    summary = {"run": {"model": "m", "task": "qa", "ctx": ctx, "method": method, "bench": {"noisy": noisy}},
               "config": {"method": {"name": method, "options": options}}, "metrics": {},
               "env": {"cpu": "Synthetic CPU", "git": {"commit": commit, "dirty": dirty}}}
    if code is not None:
        summary["env"]["git"].update(code=code, code_dirty=code_dirty)
    if capability is not None:
        summary["env"]["cpu_capability"] = capability
    if ar_path is not None:
        summary["run"]["ar_variants"] = {"ar_attention": ar_path, "threads": 2,
                                         "ar_step_s": {ar_path: {"2": 0.1}, "sdpa": {"2": 0.12}}}
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def write_cell(root: Path, chunk: str = "chunk", commits: dict | None = None, codes: dict | None = None,
               **kw) -> Path:
    """A cell's four methods at COMMIT_A without a code fingerprint, but where `commits` or `codes` (by
    method) say otherwise."""
    for method in SPEED:
        write_run(root / chunk / "0_m_qa_ctx8000" / method, method, commit=(commits or {}).get(method, COMMIT_A),
                  code=(codes or {}).get(method), **kw)
    return root


def published(tmp_path: Path) -> tuple[Path, Path]:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{publish.MARK_BEGIN}\nOLD-BLOCK\n{publish.MARK_END}\n")
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


def test_a_selection_sweep_joins_the_selection_claim_and_the_regenerating_command(tmp_path):
    readme, doc = published(tmp_path)
    results, sweep = write_cell(tmp_path / "matrix"), tmp_path / "selection"
    for method in ("sparsespec_fixed", "streaming"):
        for budget in (0.05, 0.1):
            write_run(sweep / "k16" / "0_m_qa_ctx8000_bench" / f"{method}-k=16-budget={budget}", method,
                      options={"k": 16, "budget": budget})
    for k in (4, 16):                # a sweep at each k decodes AR for the same cell: not the claim's rows
        write_run(sweep / f"k{k}" / "0_m_qa_ctx8000_bench" / "ar", "ar")
    assert claims.main([str(results), "--selection", str(sweep), "--no-figures", "--publish", "--claims", str(doc),
                        "--readme", str(readme)]) == 0
    text = doc.read_text()
    assert f"python -m analysis.claims {results} --selection {sweep} --publish" in text
    assert "recycled top-K (k=16, budget 5%) / streaming" in text and "recycled top-K (k=16, budget 10%)" in text
    assert f"--selection {sweep} --publish" in readme.read_text()


def test_a_method_folder_resumed_on_other_code_is_refused_by_its_samples_codes(tmp_path):
    """The summary names one code, but a resumed folder's samples were decoded by two: the samples decide."""
    root = tmp_path / "results"
    for method in SPEED:
        codes = [CODE_1, CODE_1, CODE_2] if method == "streaming" else None
        write_run(root / "chunk" / "0_m_qa_ctx8000" / method, method, code=CODE_1, code_dirty=False, sample_codes=codes)
    df = load_results(root)
    assert sorted(df.loc[df["method"] == "streaming", "code"]) == [CODE_1, CODE_1, CODE_2]
    with pytest.raises(PoolingError, match="from 2 versions of the code"):
        check_poolable(df)
    check_poolable(df, allow_mixed_commits=True)
    one = tmp_path / "one"
    for method in SPEED:
        write_run(one / "chunk" / "0_m_qa_ctx8000" / method, method, code=CODE_1, code_dirty=False,
                  sample_codes=[CODE_1] * 3)
    check_poolable(load_results(one))


def test_a_folder_resumed_on_another_machine_names_each_samples_own_machine(tmp_path):
    """The summary records the last sitting's machine; each stamped sample its own, and the cell names both."""
    root = tmp_path / "results"
    for method in SPEED:
        write_run(root / "chunk" / "0_m_qa_ctx8000" / method, method, code=CODE_1, code_dirty=False,
                  capability="AVX512", sample_capabilities=["AVX2", "AVX512", "AVX512"] if method == "ar" else None)
    df = load_results(root)
    ar = df[df["method"] == "ar"].sort_values("prompt_id")
    assert list(ar["hardware"]) == ["Synthetic CPU (AVX2)", "Synthetic CPU (AVX512)", "Synthetic CPU (AVX512)"]
    assert set(df.loc[df["method"] != "ar", "hardware"]) == {"Synthetic CPU (AVX512)"}
    (row,) = cell_provenance(df).to_dict("records")
    assert row["hardware"] == "Synthetic CPU (AVX2), Synthetic CPU (AVX512)"


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
    assert table.loc[8000, ["commit", "modified code", "noisy"]].tolist() == ["aaaaaaaa", "no", "no"]
    assert table.loc[4000, ["commit", "modified code", "noisy"]].tolist() == ["bbbbbbbb", "yes", "yes"]


def test_short_commits_are_distinct_sorted_and_leave_missing_ones_out():
    assert short_commits(pd.Series([COMMIT_B, None, COMMIT_A, COMMIT_B])) == ["aaaaaaaa", "bbbbbbbb"]
    assert short_commits(pd.Series([None], dtype=object)) == []


def test_a_cell_at_two_commits_with_one_code_pools_and_says_same_code(tmp_path, capsys):
    """A docs or results commit landed between chunks of a cell: the fingerprints agree, so it pools."""
    results = write_cell(tmp_path / "resumed", commits={"streaming": COMMIT_B}, codes=dict.fromkeys(SPEED, CODE_1))
    assert claims.main([str(results), "--no-figures"]) == 0
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress", "--only", "method_comparison"]) == 0
    assert cell_provenance(load_results(results))["commit"].tolist() == ["aaaaaaaa, bbbbbbbb (same code)"]
    assert "aaaaaaaa, bbbbbbbb (same code)" in (results / "claims.md").read_text()


def test_a_cell_from_two_codes_is_refused_naming_fingerprints_and_commits(tmp_path, capsys):
    """Even at one commit: the fingerprints, not the commits, decide."""
    codes = {**dict.fromkeys(SPEED, CODE_1), "streaming": CODE_2}
    results = write_cell(tmp_path / "two_codes", commits={"ar": COMMIT_B}, codes=codes)
    assert claims.main([str(results), "--no-figures"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "2 versions of the code (code 11111111 at aaaaaaaa, bbbbbbbb; code 22222222 at aaaaaaaa)" in error
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert "--allow-mixed-commits" in capsys.readouterr().err
    assert claims.main([str(results), "--no-figures", "--allow-mixed-commits"]) == 0


def test_a_run_without_a_fingerprint_is_judged_by_its_commit(tmp_path, capsys):
    """An older run (no fingerprint) pools with fingerprinted runs of its own commit, not with another's."""
    same = write_cell(tmp_path / "same_commit", codes={"ar": CODE_1, "sparsespec": CODE_1})
    assert claims.main([str(same), "--no-figures"]) == 0
    other = write_cell(tmp_path / "other_commit", commits={"streaming": COMMIT_C},
                       codes=dict.fromkeys(("ar", "sparsespec", "sparsespec_fixed"), CODE_1))
    assert claims.main([str(other), "--no-figures"]) == 2
    assert "code 11111111 at aaaaaaaa; commit cccccccc (no code fingerprint)" in capsys.readouterr().err


def test_modified_code_is_the_code_flag_when_recorded_else_the_tree_flag(tmp_path):
    """A README edited during a run (tree dirty, code clean) is not modified code; an older run's dirty
    tree still counts."""
    for method in SPEED:
        write_run(tmp_path / "r" / "docs_edit" / "0_m_qa_ctx8000" / method, method, code=CODE_1, dirty=True,
                  code_dirty=False)
        write_run(tmp_path / "r" / "code_edit" / "0_m_qa_ctx4000" / method, method, ctx=4000, code=CODE_1,
                  dirty=True, code_dirty=method == "ar")
        write_run(tmp_path / "r" / "older" / "0_m_qa_ctx2000" / method, method, ctx=2000, dirty=method == "ar")
    table = cell_provenance(load_results(tmp_path / "r")).set_index("ctx")
    assert table["modified code"].to_dict() == {2000: "yes", 4000: "yes", 8000: "no"}


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


def test_cells_against_the_old_ar_are_refused_beside_cells_against_the_measured_one(tmp_path, capsys):
    """A speed-up over the unmeasured AR (SDPA with enable_gqa) is inflated against one over the fastest
    measured path: a folder holding both kinds of cell is refused, naming the old cell, unless asked."""
    results = write_cell(tmp_path / "r", chunk="fair", codes=dict.fromkeys(SPEED, CODE_1), ar_path="packed_sdpa")
    for method in SPEED:
        write_run(results / "old" / "0_m_qa_ctx4000" / method, method, ctx=4000, code=CODE_1)
    assert claims.main([str(results), "--no-figures"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "AR of m/qa/4000 attended by an unmeasured path" in error and "beside runs in 1 cell(s)" in error
    assert figures_main([str(results), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert claims.main([str(results), "--no-figures", "--allow-mixed-commits"]) == 0
    table = cell_provenance(load_results(results)).set_index("ctx")
    assert table["AR path"].to_dict() == {4000: "unmeasured (SDPA with enable_gqa)", 8000: "packed_sdpa"}
    assert "| packed_sdpa" in (results / "claims.md").read_text()


def test_cells_all_against_one_kind_of_ar_pool(tmp_path):
    """Only the mix is refused: every cell measured (two paths chosen on two machines) or every cell old."""
    measured = write_cell(tmp_path / "measured", chunk="a", codes=dict.fromkeys(SPEED, CODE_1), ar_path="packed_sdpa")
    for method in SPEED:
        write_run(measured / "b" / "0_m_qa_ctx4000" / method, method, ctx=4000, code=CODE_1, ar_path="packed_matmul")
    check_poolable(load_results(measured))
    check_poolable(load_results(write_cell(tmp_path / "old")))


def test_a_cell_of_both_kinds_of_ar_is_refused(tmp_path):
    results = write_cell(tmp_path / "r", codes=dict.fromkeys(SPEED, CODE_1))
    write_run(results / "more" / "0_m_qa_ctx8000" / "ar2", "ar", code=CODE_1, ar_path="packed_sdpa", prompts=1)
    df = load_results(results)
    with pytest.raises(PoolingError, match="m/qa/8000 attended by an unmeasured path"):
        check_poolable(df.assign(prompt_id=df["prompt_id"] + df["run"]))


def test_cell_provenance_names_each_cells_machines_with_their_vector_width(tmp_path):
    """One CPU name covers an AVX2 and an AVX-512 machine whose speed-ups differ: the table tells them
    apart, and a cell timed on two machines names both; a run that did not record its width keeps the name."""
    for method in SPEED:
        write_run(tmp_path / "r" / "a" / "0_m_qa_ctx8000" / method, method,
                  capability="AVX2" if method == "streaming" else "AVX512")
        write_run(tmp_path / "r" / "b" / "0_m_qa_ctx4000" / method, method, ctx=4000)
    table = cell_provenance(load_results(tmp_path / "r")).set_index("ctx")
    assert table["hardware"].to_dict() == {4000: "Synthetic CPU",
                                           8000: "Synthetic CPU (AVX2), Synthetic CPU (AVX512)"}
