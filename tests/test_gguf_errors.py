"""Bad model files get clear, typed errors that name the problem."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny_gguf import write_tiny_llama
from zerolayer.daemon.programs.cli import main as cli_main
from zerolayer.gpu.errors import ModelFormatError, UnsupportedModelError
from zerolayer.gpu.model import LlamaModel


def test_truncated_file(tmp_path, tiny_path):
    data = open(tiny_path, "rb").read()
    for cut in (10, len(data) // 3, len(data) - 100):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelFormatError):
            LlamaModel.load(str(p))


def test_not_a_gguf(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        LlamaModel.load(str(p))


def test_missing_file():
    with pytest.raises(ModelFormatError, match="not found"):
        LlamaModel.load("/nonexistent/model.gguf")


def test_unsupported_tensor_type_is_named(tmp_path):
    p = tmp_path / "mxfp4.gguf"  # (Q5_0 runs now; MXFP4 is one gguf can write)
    write_tiny_llama(str(p), override={"ffn_up": QT.MXFP4})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_up\.weight.*MXFP4"):
        LlamaModel.load(str(p))


def test_unsupported_architecture_is_named(tmp_path):
    p = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(p), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        LlamaModel.load(str(p))


def test_cli_reports_bad_model_cleanly(tmp_path, capsys):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"GGUF" + b"\xff" * 64)
    assert cli_main(["generate", "hi", "--model", str(p)]) == 2
    assert "error" in capsys.readouterr().err
