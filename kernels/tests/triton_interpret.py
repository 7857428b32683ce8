"""Triton's CPU interpreter, made to compute bf16 dots as a GPU does."""

from __future__ import annotations

import os

_PATCHED = False


def widen_bf16_dots() -> None:
    """Under TRITON_INTERPRET=1, make `tl.dot` on bf16 operands multiply their values.

    NOTE: the interpreter keeps bf16 tensors as raw uint16 bits and its dot (numpy matmul)
    multiplies those bits as integers. Widening each bf16 operand to fp32 first is exact and
    is what tensor cores compute (bf16 products accumulated in fp32), so a kernel's bf16
    path is checked as it runs on a GPU. Idempotent; a no-op off the interpreter.
    """
    global _PATCHED
    if _PATCHED or os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widen(x: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if x.dtype.scalar != tl.bfloat16:
            return x
        data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def bf16_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = bf16_dot
    _PATCHED = True
