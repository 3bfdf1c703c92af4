"""Write a draft model for speculative decoding from a GGUF model: a copy that keeps the
model's vocabulary and some of its layers, its weights optionally rounded again to another
quantized type.

Re-quantizing the bundled SmolLM2-135M (Q4_1) to Q4_0 gives other weights whose greedy
guesses are often, not always, the model's: a real draft, made from the bundled file alone,
with no quantizer to build. (Dropping layers from this model instead leaves a draft that
almost never agrees with it: 20 of 30 layers matched 1 guess in 32.)
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import gguf

_LAYER = re.compile(r"^blk\.(\d+)\.")
_FLOAT = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def gguf_layers(path: str) -> int:
    """How many transformer layers the model at path has ({arch}.block_count)."""
    r = gguf.GGUFReader(path)
    return int(r.fields[f"{r.fields['general.architecture'].contents()}.block_count"].contents())


def write_draft(src: str, dst: str, layers: Sequence[int],
                requantize: gguf.GGMLQuantizationType | None = None) -> None:
    """Copy src to dst keeping only the given layers, in order, renumbered 0.. (so
    {arch}.block_count is len(layers)); requantize: every quantized tensor dequantized and
    quantized again to this type (other rounding: other weights, same vocabulary)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    block_key = f"{arch}.block_count"
    have = int(r.fields[block_key].contents())
    if not layers or any(not 0 <= i < have for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"{src} has {have} layers; cannot keep {list(layers)}")
    new_index = {old: new for new, old in enumerate(layers)}
    w = gguf.GGUFWriter(dst, arch)  # writes general.architecture itself
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the header's fields: the writer writes its own
        if key == block_key:
            w.add_block_count(len(layers))
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    for t in r.tensors:
        name = t.name
        m = _LAYER.match(name)
        if m:
            if int(m.group(1)) not in new_index:
                continue
            name = f"blk.{new_index[int(m.group(1))]}.{name[m.end():]}"
        if requantize is not None and t.tensor_type not in _FLOAT:
            w.add_tensor(name, gguf.quants.quantize(
                gguf.quants.dequantize(t.data, t.tensor_type), requantize), raw_dtype=requantize)
            continue
        # data as the reader maps it: bytes for quantized types, floats for F16/F32
        w.add_tensor(name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
