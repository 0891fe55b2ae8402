"""Wire compression for allreduce: floating-point tensors cast to 16 bits, or sent as int8 blocks."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Interface: ``compress`` returns (tensor_on_the_wire, context); ``decompress`` undoes it."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors unchanged."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: tf.DType = tf.float16

    @classmethod
    def compress(cls, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tf.cast(tensor, ctx) if ctx is not None and tensor.dtype != ctx else tensor


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (float32's range, half its bytes)."""

    wire_dtype = tf.bfloat16


class Int8Compressor(Compressor):
    """Sends floating-point tensors as int8 with one float32 scale per block of 256 elements.

    The engine does it inside its allreduce (``Sum`` and ``Average`` only): each step of its
    ring dequantizes what it receives, adds it in float32 and quantizes again before sending
    on, so about a quarter of float32's bytes cross the wire. docs/compression.md states the
    error bound. There is no TensorFlow-side ``compress``/``decompress``: int8 values with
    different scales cannot be summed by an uncompressed allreduce.
    """


class Compression:
    """Horovod-compatible namespace: ``Compression.none``, ``.fp16``, ``.bf16`` and ``.int8``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    int8 = Int8Compressor


def validate(compression: Any) -> type[Compressor]:
    """Returns ``compression`` when it is a compressor, so a typo fails where it is passed.

    Raises:
        TypeError: for anything but a ``Compressor`` subclass (``Compression.none``,
            ``.fp16``, ``.bf16``, ``.int8`` or your own), e.g. the string ``"fp16"``.
    """
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    raise TypeError(
        "compression must be smdist_tf.Compression.none, .fp16, .bf16 or .int8 (or a Compressor subclass), "
        f"got {compression!r} ({type(compression).__name__})"
    )
