"""No kernel compiles during the first requests after warm-up, for a model whose formats
differ from the bundled one's: warm-up runs the model itself, so it must cover whatever
its own layers are (a Q4_K_M file is mostly Q5_0, Q8_0 and Q6_K)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from gguf import GGMLQuantizationType as QT

from tiny_gguf import write_tiny_llama

HERE = os.path.dirname(os.path.abspath(__file__))

# every matmul weight quantized (no F16 to widen a stack to float32), in the formats a
# K-quant file falls back to at widths that are not multiples of 256
FORMATS = {"attn_q": QT.Q5_0, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "attn_output": QT.Q5_1,
           "ffn_gate": QT.Q5_0, "ffn_up": QT.Q5_0, "ffn_down": QT.Q8_0, "token_embd": QT.Q5_0,
           # and layers of one kind in different formats (a mixed stack: each layer its own)
           "blk.1.ffn_down": QT.Q5_0}


def test_no_compilation_during_first_requests_after_warmup(tmp_path):
    path = str(tmp_path / "q5-q8.gguf")
    write_tiny_llama(path, override=FORMATS, tokenizer=True, tied=True)
    r = subprocess.run([sys.executable, os.path.join(HERE, "warm_probe.py"), path],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["warm_signatures"] > 0  # the probe sees the runtime's kernels at all
    assert out["compiled"] == [] and out["new_signatures"] == {}, out
