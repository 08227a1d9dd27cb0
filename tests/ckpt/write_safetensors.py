#!/usr/bin/env python3
"""Writes the safetensors files tests/ckpt/import_test.cpp imports, with Hugging Face's
`safetensors` package (installed by tools/setup.sh into .cache/pyvenv):

  write_safetensors.py OUT_DIR SPEC_JSON

SPEC_JSON: [[name, [d0, d1, ...]], ...]. Writes into OUT_DIR
  single-F32.safetensors, single-F16.safetensors   numpy arrays, safetensors.numpy.save_file
  single-BF16.safetensors                          raw bf16 bytes, safetensors.serialize_file
  sharded/model-0000k-of-00002.safetensors + model.safetensors.index.json
                                                   tensor k in F32 / BF16 / F16 by k % 3, the
                                                   set split in two files as transformers does

Values: tensor k, element i: an f32 with 24 significant bits (so that the 16-bit roundings
matter), scaled by 2^(k % 5 - 2); element 0 of tensor 0 is 1e5 (over f16's range) and element 1
is 1e-40 (an f32 subnormal). BF16 is f32 rounded to nearest, ties to even (numpy has no bf16);
F16 is numpy's astype (round to nearest even).
"""
import json
import os
import sys

import numpy as np
import safetensors
from safetensors.numpy import save_file


def values(k, shape):
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.uint64)
    bits = (i * np.uint64(2654435761) + np.uint64(k * 40503 + 12345)) % np.uint64(1 << 24)
    v = (bits.astype(np.float64) - float(1 << 23)) / float(1 << 20)
    v = (v * 2.0 ** (k % 5 - 2)).astype(np.float32)
    if k == 0 and n >= 2:
        v[0] = np.float32(1e5)
        v[1] = np.float32(1e-40)
    return v.reshape(shape)


def bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return r.astype(np.uint16)


def raw(dtype, a):
    """(safetensors dtype name, shape, little-endian bytes) of an f32 array stored as dtype."""
    if dtype == "F32":
        return "float32", list(a.shape), a.astype("<f4").tobytes()
    if dtype == "F16":
        return "float16", list(a.shape), a.astype("<f2").tobytes()
    return "bfloat16", list(a.shape), bf16_bits(a).astype("<u2").tobytes()


def serialize_raw(tensors, path, metadata):
    """tensors: {name: (dtype name, shape, bytes)} through safetensors' raw serialize API."""
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7: pointers to live buffers
        keep = {k: np.frombuffer(b, dtype=np.uint8) for k, (_, _, b) in tensors.items()}
        specs = {
            k: safetensors.TensorSpec(dtype=d, shape=s, data_ptr=keep[k].ctypes.data,
                                      data_len=len(b))
            for k, (d, s, b) in tensors.items()
        }
        safetensors.serialize_file(specs, path, metadata=metadata)
    else:  # older: {"dtype", "shape", "data": bytes}
        specs = {k: {"dtype": d, "shape": s, "data": b} for k, (d, s, b) in tensors.items()}
        safetensors.serialize_file(specs, path, metadata=metadata)


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    arrays = {name: values(k, tuple(shape)) for k, (name, shape) in enumerate(spec)}
    meta = {"format": "pt", "writer": "tests/ckpt/write_safetensors.py"}
    save_file(arrays, os.path.join(out, "single-F32.safetensors"), metadata=meta)
    with np.errstate(over="ignore"):  # 1e5 -> inf in f16, as intended
        f16 = {k: v.astype(np.float16) for k, v in arrays.items()}
    save_file(f16, os.path.join(out, "single-F16.safetensors"), metadata=meta)
    serialize_raw({k: raw("BF16", v) for k, v in arrays.items()},
                  os.path.join(out, "single-BF16.safetensors"), meta)
    # The sharded set: the first half of the tensors in file 1, the rest in file 2.
    names = [name for name, _ in spec]
    half = (len(names) + 1) // 2
    weight_map, total = {}, 0
    for part, chunk in enumerate([names[:half], names[half:]]):
        fname = "model-%05d-of-%05d.safetensors" % (part + 1, 2)
        tensors = {}
        for name in chunk:
            k = names.index(name)
            with np.errstate(over="ignore"):
                tensors[name] = raw(("F32", "BF16", "F16")[k % 3], arrays[name])
            weight_map[name] = fname
            total += len(tensors[name][2])
        serialize_raw(tensors, os.path.join(out, "sharded", fname), meta)
    with open(os.path.join(out, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print("wrote", out, "with safetensors", safetensors.__version__)


if __name__ == "__main__":
    main()
