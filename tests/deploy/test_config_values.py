"""What a genai_config.json (or a fused folder's manifest) holds is data, not trusted: integers of any length, sizes
that are no sizes, name templates that would make a regular expression backtrack, thousands of sections. Each is
refused in one line (exit 2) before anything is written, or handled in time linear in the config."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.conftest import run_cli, tree_digest
from deploy.genai_folders import genai_config, simplified_norm_model
from ort_rmsnorm import folders
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.folders import genai_config as config_text
from cli.conftest import one_line_error
from ort_rmsnorm.folders.layout import Component
from ort_rmsnorm.folders.verify import CacheSizes, _genai_default_dims, match_template


def _leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir() if path.name.startswith("."))


def _set(folder: Path, edit) -> None:
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    edit(config["model"]["decoder"])
    path.write_text(json.dumps(config, indent=2))


# --- integers past Python's conversion limit ----------------------------------------------------------------------


@pytest.mark.parametrize("digits", [4301, 20_000])
def test_a_long_integer_in_the_config_is_refused(onnx_genai_folder, tmp_path, digits):
    path = onnx_genai_folder / "genai_config.json"
    text = path.read_text().replace('"context_length": 128', f'"context_length": -{"9" * digits}')
    assert text != path.read_text()
    path.write_text(text)
    out = tmp_path / "out"
    line = one_line_error(run_cli("fuse", onnx_genai_folder, out, "--quiet"), "genai_config.json",
                           f"{digits} digits")
    assert len(line) < 400  # the number itself is not printed
    assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(config_text.ConfigError, match=f"{digits} digits"):
        config_text.parse(text.encode())


def test_a_long_integer_just_within_the_limit_is_read():
    value = config_text.parse(f'{{"a": [{"7" * config_text.MAX_INTEGER_DIGITS}]}}'.encode())
    assert value["a"][0] == int("7" * config_text.MAX_INTEGER_DIGITS)


def test_a_long_integer_in_the_manifest_refuses_replace(onnx_folder, tmp_path):
    out = tmp_path / "out"
    folders.fuse_folder(onnx_folder, out)
    manifest = out / folders.MANIFEST
    data = json.loads(manifest.read_text())
    text = json.dumps(data, indent=2).replace('"format": 1', f'"format": 1{"0" * 5000}')
    manifest.write_text(text)
    before = tree_digest(out)
    one_line_error(run_cli("fuse", onnx_folder, out, "--replace", "--quiet"), str(out), folders.MANIFEST)
    assert tree_digest(out) == before and _leftovers(tmp_path) == []


# --- sizes verify makes inputs of ---------------------------------------------------------------------------------

BAD_SIZES = {
    "head_size -1": (lambda decoder: decoder.update(head_size=-1), "model.decoder.head_size is -1"),
    "head_size 10**30": (lambda decoder: decoder.update(head_size=10**30),
                         "model.decoder.head_size is an integer of 31 digits"),
    "head_size 0": (lambda decoder: decoder.update(head_size=0), "model.decoder.head_size is 0"),
    "window_size -3": (lambda decoder: decoder.update(sliding_window={"window_size": -3, "layers": [0]}),
                       "model.decoder.sliding_window.window_size is -3"),
    "window_size 2**40": (lambda decoder: decoder.update(sliding_window={"window_size": 2**40}),
                          f"model.decoder.sliding_window.window_size is {2**40}"),
}


@pytest.mark.parametrize("case", BAD_SIZES)
def test_bad_sizes_refused_by_verify(onnx_genai_folder, tmp_path, case):
    edit, fragment = BAD_SIZES[case]
    out = tmp_path / "out"
    folders.fuse_folder(onnx_genai_folder, out)
    _set(onnx_genai_folder, edit)
    one_line_error(run_cli("verify", onnx_genai_folder, out, "--quiet"), "genai_config.json", fragment)


@pytest.mark.parametrize("case", ["head_size -1", "window_size -3"])
def test_bad_sizes_refused_by_fuse_verify_before_writing(onnx_genai_folder, tmp_path, case):
    edit, fragment = BAD_SIZES[case]
    _set(onnx_genai_folder, edit)
    out = tmp_path / "out"
    one_line_error(run_cli("fuse", onnx_genai_folder, out, "--verify", "--quiet"), fragment)
    assert not out.exists() and _leftovers(tmp_path) == []


def test_sizes_within_bounds_are_used():
    """The past inputs take the config's head size, and a sliding layer's the window; a layer number of thousands of
    digits is no listed layer (never converted to an int)."""
    sizes = CacheSizes(("past_key_values.%d.key", "past_key_values.%d.value"), head_size=16, window_size=8,
                       sliding_layers=frozenset({1}))
    decoder = Component("model.onnx", [("model", "decoder")])
    shape = ["batch", "heads", "past", "head"]
    assert _genai_default_dims(sizes, decoder, {"past_key_values.1.key": shape}) == {"head": 16, "past": 8}
    assert _genai_default_dims(sizes, decoder, {"past_key_values.0.value": shape}) == {"head": 16}
    assert _genai_default_dims(sizes, decoder, {"past_key_values.001.value": shape}) == {"head": 16, "past": 8}
    huge = f"past_key_values.{'1' * 5000}.key"
    assert _genai_default_dims(sizes, decoder, {huge: shape}) == {"head": 16}
    everywhere = CacheSizes(sizes.templates, head_size=16, window_size=8)
    assert _genai_default_dims(everywhere, decoder, {huge: shape}) == {"head": 16, "past": 8}


@pytest.mark.parametrize("dim", ["-1", "1" + "0" * 30, "9" * 5000, "²"])
def test_bad_dim_option_is_refused(tmp_path, dim):
    model = tmp_path / "m.onnx"
    save_model(simplified_norm_model(1), model)
    out = tmp_path / "o.onnx"
    one_line_error(run_cli("fuse", model, out, "--verify", "--dim", f"batch={dim}", "--quiet"), "--dim")
    assert not out.exists()


# --- name templates: matched without backtracking -----------------------------------------------------------------


def _regex(template: str, name: str) -> str | None:
    match = re.fullmatch(re.escape(template).replace("%d", "([0-9]+)"), name)
    return None if match is None else match.group(1) if match.re.groups else ""


def test_templates_match_as_the_regular_expression_does():
    rng = random.Random(7)
    matched = 0
    for _ in range(3000):
        pieces = [rng.choice(["", "a", ".", "1", "x.", "%", "key"]) for _ in range(rng.randint(1, 5))]
        template = "%d".join(pieces)
        if rng.random() < 0.7:  # a name the template may well match: each %d some digits, a piece changed now and then
            name = "".join(piece + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
                           for piece in pieces[:-1]) + pieces[-1]
            if rng.random() < 0.2 and name:
                position = rng.randrange(len(name))
                name = name[:position] + rng.choice("a.9") + name[position + 1:]
        else:
            name = "".join(rng.choice("a.19x%") for _ in range(rng.randint(0, 10)))
        expected = _regex(template, name)
        assert match_template(template, name) == expected, (template, name)
        matched += expected is not None
    assert matched > 1000


def test_many_adjacent_holes_against_many_digits_finish():
    """24 ``%d`` in a row against names of 64 digits: a backtracking regular expression tries every way to split the
    digits (it runs for hours); the matcher makes one pass per hole. Run in a subprocess with a generous limit."""
    code = ("from ort_rmsnorm.folders.verify import match_template as m\n"
            "t = 'past.' + '%d' * 24 + '.key'\n"
            "print(m(t, 'past.' + '7' * 64 + '.key'), m(t, 'past.' + '7' * 64 + '.value'), m('%d' * 24, '7' * 23))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["7" * 41, "None", "None"]


# --- many sections: linear ----------------------------------------------------------------------------------------


class _CountingDecoder(json.JSONDecoder):
    """The JSON decoder genai_config finds and edits values with, counting the characters it decodes (parsing the
    config once is linear in any case)."""

    def __init__(self):
        super().__init__(parse_int=config_text._integer)
        self.characters = 0

    def raw_decode(self, s, idx=0):
        value, end = super().raw_decode(s, idx)
        self.characters += end - idx
        return value, end


def _sections_folder(root: Path, count: int) -> Path:
    folder = root / f"in-{count}"
    folder.mkdir()
    save_model(simplified_norm_model(1), folder / "model.onnx")
    config = genai_config()
    config["model"]["decoder"]["pipeline"] = [
        {f"stage{index}": {"filename": "model.onnx", "session_options": {"log_id": f"stage{index}"}}}
        for index in range(count)]
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_config_work_is_linear_in_the_sections(tmp_path, monkeypatch):
    """K pipeline sections naming one model, each with its own session options: each gets the library key, and the
    characters decoded (reading the config, finding every object, inserting every key) grow as the config does, not
    as its square (8 times the sections: about 8 times the work; one insertion after another decoded it all again)."""
    work = {}
    for count in (250, 2000):
        folder = _sections_folder(tmp_path, count)
        decoder = _CountingDecoder()
        monkeypatch.setattr(config_text, "_DECODER", decoder)
        out = tmp_path / f"out-{count}"
        report = folders.fuse_folder(folder, out)
        monkeypatch.undo()
        assert len(report.config_changes) == count + 1  # every stage, and the decoder
        fused = json.loads((out / "genai_config.json").read_text())
        stages = fused["model"]["decoder"]["pipeline"]
        assert all(stage[f"stage{index}"]["session_options"] == {"log_id": f"stage{index}",
                                                                 "custom_ops_library": report.library}
                   for index, stage in enumerate(stages))
        work[count] = decoder.characters / (folder / "genai_config.json").stat().st_size
    ratio = work[2000] / work[250]
    assert 0.5 < ratio < 2, work  # characters decoded per character of config: the same at both sizes
