"""Collective operations with Horovod's TensorFlow signatures, and their gradients.

Every function works eagerly and inside ``tf.function``. Collectives are matched
across ranks by name: pass ``name=`` when ranks may issue them in different
orders. Unnamed eager collectives are numbered per kind in call order; unnamed
graph collectives use their (unique) node name.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Union

import tensorflow as tf

from smdist_tf import process_sets as _process_sets, reduce_ops
from smdist_tf._native import op_module as _ops, runtime as _rt
from smdist_tf.compression import (BF16Compressor, Compression, Compressor, FP16Compressor, Int8Compressor, NoneCompressor,
                                   validate as validate_compression)
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from smdist_tf.runtime import rank, require_initialized, size

TensorLike = Union[tf.Tensor, tf.Variable, tf.IndexedSlices, Any]

_REDUCIBLE = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64)
_MOVABLE = _REDUCIBLE + (tf.bool,)
_REDUCIBLE_SET = frozenset(_REDUCIBLE)
_MOVABLE_SET = frozenset(_MOVABLE)
# The built-in compressors run inside the engine (narrowed while packing the
# fusion buffer, widened while unpacking); other Compressor classes run in TF.
_ENGINE_COMPRESSION = {NoneCompressor: "none", FP16Compressor: "fp16", BF16Compressor: "bf16", Int8Compressor: "int8"}


def _engine_compression(compression: Any) -> Optional[str]:
    """The engine's name for a built-in compressor, or None for a user's Compressor subclass.

    Raises:
        TypeError: when ``compression`` is not a compressor at all.
    """
    try:
        found = _ENGINE_COMPRESSION.get(compression)
    except TypeError:  # unhashable: certainly not a compressor class
        found = None
    if found is None:
        validate_compression(compression)
    return found


# Eager calls pass their name as a ready string tensor: a Python str sends every call
# down TensorFlow's slow op path (about 35 us more). Cleared when full, so ever new
# names cannot grow it.
_NAME_TENSORS: dict[str, tf.Tensor] = {}
_NAME_TENSORS_MAX = 4096


def _collective_name(kind: str, name: Optional[str], eager: Optional[bool] = None) -> Union[str, tf.Tensor]:
    """The op's ``tensor_name`` input: the name ranks use to match this collective.

    ``eager`` says whether executing eagerly, when the caller knows.
    """
    if not (tf.executing_eagerly() if eager is None else eager):
        return name or ""  # the kernel falls back to its node name, unique in the graph
    # The kernel numbers each unnamed call ("allreduce.noname.7").
    key = name or f"{kind}.noname"
    tensor = _NAME_TENSORS.get(key)
    if tensor is None:
        if len(_NAME_TENSORS) >= _NAME_TENSORS_MAX:
            _NAME_TENSORS.clear()
        tensor = _NAME_TENSORS[key] = tf.constant(key)
    return tensor


def _unordered(result: Any) -> Any:
    """Lets a collective inside ``tf.function`` start as soon as its inputs are ready.

    tf.function chains stateful ops in program order, which would run a step's
    collectives one after another, each waiting for the last to finish on every
    rank, and never fused. The engine matches collectives by name, not order, and
    they touch no state but their own inputs and outputs, so they are marked to
    run independently (still always run, before the function returns). Barriers
    and point-to-point ops keep their order.
    """
    if tf.executing_eagerly():
        return result
    first = result[0] if isinstance(result, (list, tuple)) else result
    # Every tf.Graph has it (listed in smdist_tf/_compat.py): the AutomaticControlDependencies
    # context while tf.function traces, else None (a tf.compat.v1 graph).
    manager = first.graph.experimental_acd_manager
    if manager is not None:
        manager.run_independently(first.op)
    return result


def _as_tensor(value: Any) -> tf.Tensor:
    # Skips convert_to_tensor's dispatch for what is already a tensor (eager hot path).
    return value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)


def _check_dtype(tensor: tf.Tensor, allowed: Sequence[tf.DType], what: str) -> None:
    allowed_set = _REDUCIBLE_SET if allowed is _REDUCIBLE else _MOVABLE_SET if allowed is _MOVABLE else frozenset(allowed)
    if tensor.dtype not in allowed_set:
        names = ", ".join(d.name for d in allowed)
        raise TypeError(f"{what} does not support dtype {tensor.dtype.name}; supported: {names}")


def _resolve_op(average: Optional[bool], op: Optional[int]) -> int:
    if average is not None:
        if op is not None:
            raise ValueError("pass either op= or the deprecated average=, not both")
        warnings.warn("average= is deprecated; use op=smdist_tf.Average or op=smdist_tf.Sum", DeprecationWarning)
        return Average if average else Sum
    return reduce_ops.validate(Average if op is None else op)


def _alone(process_set_id: int) -> bool:
    """Whether this rank is the only member of the set (a non-member must reach the engine, which refuses it)."""
    if process_set_id == 0:
        return size() == 1
    ranks, index = _rt.process_set_membership(process_set_id)
    return len(ranks) == 1 and index == 0


def _allreduce_dense(tensors: list, op: int, prescale: float, postscale: float, name: Optional[str],
                     compression: str = "none", process_set_id: int = 0) -> list:
    """One engine request for all ``tensors`` (negotiated together, fused).

    ``compression`` ('none', 'fp16', 'bf16', 'int8') is the type floating-point tensors travel as.
    """
    require_initialized()
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        return []
    if prescale == 1.0 and postscale == 1.0 and compression == "none" and _alone(process_set_id):
        # A job of one has nothing to reduce: every op leaves the tensor as it is, and the
        # engine round trip would cost a small training step about a quarter of its time.
        return tensors
    eager = tf.executing_eagerly()
    try:
        reduced = _ops.smdist_allreduce(
            tensors=tensors,
            reduce_op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            tensor_name=_collective_name("allreduce", name, eager),
            # The calling thread runs the engine cycle itself when none is running, instead of
            # handing off to the engine thread: eager callers wait for the result anyway, and in a
            # tf.function this cuts a dependent collective's latency about 4x (docs/architecture.md).
            run_inline=True,
            compression=compression,
            process_set_id=process_set_id,
        )
    except (TypeError, tf.errors.InvalidArgumentError):
        # TensorFlow checks the dtypes against the op's list before anything is submitted, so
        # they are only checked here, where the error is reworded, not per tensor on every call.
        for t in tensors:
            _check_dtype(t, _REDUCIBLE, "allreduce")
        raise
    return list(reduced if eager else _unordered(reduced))


def _allreduce_sparse(slices: tf.IndexedSlices, op: int, prescale: float, postscale: float, name: Optional[str],
                      process_set: Optional[ProcessSet] = None):
    """Sparse gradients travel as two allgathers (values, indices), as in Horovod."""
    if op == Adasum:
        raise NotImplementedError("Adasum does not reduce tf.IndexedSlices (sparse gradients): densify them first, "
                                  "e.g. sparse_as_dense=True in DistributedGradientTape/DistributedOptimizer")
    if op not in (Average, Sum):
        raise NotImplementedError(f"allreduce of tf.IndexedSlices supports Average and Sum, not {reduce_ops.op_name(op)}")
    base = name or None
    values = allgather(slices.values, name=f"{base}.values" if base else None, process_set=process_set)
    indices = allgather(slices.indices, name=f"{base}.indices" if base else None, process_set=process_set)
    scale = prescale * postscale / (len(_process_sets.membership(process_set)[1]) if op == Average else 1)
    if scale != 1.0:
        if values.dtype.is_floating:
            values = values * tf.cast(scale, values.dtype)
        else:
            # Horovod divides integer rows exactly, giving floating-point values (TensorFlow's
            # true division: float32 for 8/16-bit integers, float64 for 32/64-bit ones).
            values = tf.cast(values, tf.float32 if values.dtype.size <= 2 else tf.float64) * scale
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(
    tensor: TensorLike,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
    ignore_name_scope: bool = False,
) -> TensorLike:
    """Reduces ``tensor`` over all ranks; every rank receives the result.

    Args:
        tensor: a tensor, variable or ``tf.IndexedSlices`` (gathered, not summed densely;
            without prescale/postscale factors, as in Horovod).
        average: deprecated; ``True`` means ``op=Average``, ``False`` means ``op=Sum``.
        device_dense: accepted for Horovod compatibility (CPU only today).
        device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` (cast on the wire), ``.int8``
            (int8 blocks on the wire, summed in float32; ``Sum`` and ``Average`` only, see
            docs/compression.md), or a ``Compressor`` subclass; anything else raises TypeError.
        op: ``Average`` (default), ``Sum``, ``Adasum``, ``Min``, ``Max`` or ``Product``.
            ``Adasum`` needs a power-of-two number of ranks (in ``process_set``), floating-point
            dense tensors and no wire compression (``smdist_tf.reduce_ops``).
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after the reduction (and averaging).
        name: name used to match this collective across ranks.
        process_set: the ``ProcessSet`` to reduce over (``None``: all ranks); only its
            members may call it, and Average divides by its size.
        ignore_name_scope: accepted for Horovod compatibility.

    Returns:
        The reduced tensor, same shape and dtype as ``tensor``.
    """
    psid = _process_sets.process_set_id(process_set)
    op = _resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            # As Horovod: scale the values yourself (grouped_allreduce and the tape do).
            raise NotImplementedError("allreduce of tf.IndexedSlices does not take prescale_factor or "
                                      "postscale_factor; scale the values instead")
        return _allreduce_sparse(tensor, op, 1.0, 1.0, name, process_set)
    tensor = _as_tensor(tensor)
    engine_compression = _engine_compression(compression)
    if engine_compression is not None:
        (reduced,) = _allreduce_dense([tensor], op, prescale_factor, postscale_factor, name, engine_compression, psid)
        return reduced
    wire, ctx = compression.compress(tensor)
    (reduced,) = _allreduce_dense([wire], op, prescale_factor, postscale_factor, name, "none", psid)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(
    tensors: Sequence[TensorLike],
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
) -> list:
    """Reduces a list of tensors as one group: negotiated together and fused into as few transfers as possible.

    Arguments are as for :func:`allreduce`; returns the reduced tensors in order.
    """
    psid = _process_sets.process_set_id(process_set)
    op = _resolve_op(average, op)
    tensors = list(tensors)
    engine_compression = _engine_compression(compression)
    if engine_compression is not None and all(isinstance(t, tf.Tensor) for t in tensors):
        # The common case (dense gradients, built-in compression): no per-tensor bookkeeping.
        return _allreduce_dense(tensors, op, prescale_factor, postscale_factor, name, engine_compression, psid)
    results: list = [None] * len(tensors)
    dense_positions, wires, contexts = [], [], []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            sparse_name = f"{name}.sparse{i}" if name else None
            results[i] = _allreduce_sparse(t, op, prescale_factor, postscale_factor, sparse_name, process_set)
            continue
        t = _as_tensor(t)
        wire, ctx = (t, None) if engine_compression is not None else compression.compress(t)
        dense_positions.append(i)
        wires.append(wire)
        contexts.append(ctx)
    reduced = _allreduce_dense(wires, op, prescale_factor, postscale_factor, name, engine_compression or "none", psid)
    for i, r, ctx in zip(dense_positions, reduced, contexts):
        results[i] = r if engine_compression is not None else compression.decompress(r, ctx)
    return results


def allgather(tensor: TensorLike, name: Optional[str] = None, process_set: Optional[ProcessSet] = None, ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along dimension 0, in rank order.

    The first dimension may differ per rank; the others must match. A scalar is
    treated as a vector of one element. With ``process_set``, only its members
    take part, in the order of their ranks.
    """
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, _MOVABLE, "allgather")
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])
    return _unordered(_ops.smdist_allgather(tensor=tensor, tensor_name=_collective_name("allgather", name),
                                            process_set_id=psid))


def grouped_allgather(tensors: Sequence[TensorLike], name: Optional[str] = None, process_set: Optional[ProcessSet] = None) -> list:
    """:func:`allgather` of each tensor (Horovod's ``grouped_allgather``), one request each; results in order."""
    return [allgather(t, name=f"{name}.{i}" if name else None, process_set=process_set) for i, t in enumerate(tensors)]


def broadcast(tensor: TensorLike, root_rank: int, name: Optional[str] = None, process_set: Optional[ProcessSet] = None, ignore_name_scope: bool = False) -> tf.Tensor:
    """Returns ``root_rank``'s value of ``tensor`` on every rank (of ``process_set``).

    ``root_rank`` is a rank of the job (as Horovod's), a member of ``process_set``.
    """
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, _MOVABLE, "broadcast")
    (out,) = _unordered(_ops.smdist_broadcast(tensors=[tensor], root_rank=int(root_rank),
                                              tensor_name=_collective_name("broadcast", name), process_set_id=psid))
    return out


def grouped_broadcast(tensors: Sequence[TensorLike], root_rank: int, name: Optional[str] = None,
                      process_set: Optional[ProcessSet] = None) -> list:
    """Broadcasts several tensors in one request (one negotiation round)."""
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        _check_dtype(t, _MOVABLE, "broadcast")
    if not tensors:
        return []
    return list(_unordered(_ops.smdist_broadcast(tensors=tensors, root_rank=int(root_rank),
                                                 tensor_name=_collective_name("broadcast", name),
                                                 process_set_id=psid)))


def alltoall(tensor: TensorLike, splits: Optional[TensorLike] = None, name: Optional[str] = None, process_set: Optional[ProcessSet] = None, ignore_name_scope: bool = False):
    """Sends ``splits[r]`` rows of ``tensor`` (in order) to rank ``r`` and receives theirs.

    Without ``splits`` the first dimension is divided equally (it must divide by the
    number of ranks). With ``process_set``, ``r`` counts its members in rank order.

    Returns:
        The received rows concatenated in rank order; with ``splits`` given, the
        tuple ``(received, received_splits)``.
    """
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, _MOVABLE, "alltoall")
    split_tensor = tf.zeros([0], tf.int64) if splits is None else tf.cast(tf.convert_to_tensor(splits), tf.int64)
    out, received = _unordered(_ops.smdist_alltoall(tensor=tensor, splits=split_tensor,
                                                    tensor_name=_collective_name("alltoall", name),
                                                    process_set_id=psid))
    return out if splits is None else (out, received)


def reducescatter(
    tensor: TensorLike,
    op: int = Average,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduces ``tensor`` over ranks and returns this rank's block of dimension 0.

    Rank ``r`` receives ``d // n`` rows, plus one if ``r < d % n`` (``d`` rows, ``n`` ranks;
    with ``process_set``, its members and their index among them).
    """
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    op = reduce_ops.validate(op)
    if op == Adasum:
        raise ValueError("reducescatter does not take op=Adasum; Adasum is an allreduce op")
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, _REDUCIBLE, "reducescatter")
    return _unordered(_ops.smdist_reducescatter(
        tensor=tensor,
        reduce_op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        tensor_name=_collective_name("reducescatter", name),
        process_set_id=psid,
    ))


def grouped_reducescatter(
    tensors: Sequence[TensorLike],
    op: int = Average,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list:
    """:func:`reducescatter` of each tensor (Horovod's ``grouped_reducescatter``); results in order."""
    return [
        reducescatter(t, op=op, name=f"{name}.{i}" if name else None, process_set=process_set,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        for i, t in enumerate(tensors)
    ]


def barrier(process_set: Optional[ProcessSet] = None, name: Optional[str] = None) -> None:
    """Returns once every rank (of ``process_set``) has called ``barrier()``."""
    psid = _process_sets.process_set_id(process_set)
    require_initialized()
    _ops.smdist_barrier(tensor_name=_collective_name("barrier", name), process_set_id=psid)


def join() -> Union[int, tf.Tensor]:
    """Waits until every rank has called ``join()``, taking part in the others' collectives meanwhile.

    Call it when this rank has run out of data while others may still train
    (Horovod semantics). Until every rank has joined, the collectives the other
    ranks submit complete without this one: allreduce treats a joined rank's
    tensor as zeros (Sum, and Average, which then divides by the number of ranks
    that contributed) or as the reduction's identity (Min, Max, Product);
    allgather takes no rows from it; a barrier counts it as arrived; a broadcast
    from a rank that has not joined reaches it (and is discarded). Alltoall,
    reducescatter, a broadcast whose root has joined, and Min/Max/Product with a
    ``prescale_factor`` cannot complete that way: they raise
    ``tf.errors.FailedPreconditionError`` on the ranks that submitted them, and
    ``join()`` raises the same error on the joined ranks.

    The ranks that trained longer applied updates the joined ranks did not: to
    continue with identical weights, broadcast them from the returned rank, e.g.
    ``broadcast_variables(model.variables + optimizer.variables, root_rank=join())``.
    Keras ``fit`` does all of this at the end of every epoch by itself.

    Returns:
        The rank that joined last: a Python int when executing eagerly, an int32
        scalar tensor inside ``tf.function``.
    """
    require_initialized()
    last_joined = _ops.smdist_join()
    return int(last_joined) if tf.executing_eagerly() else last_joined


def oob_allreduce(tensor: TensorLike, name: Optional[str] = None) -> tf.Tensor:
    """SageMaker data-parallel spelling: averages a non-gradient value (e.g. the loss) over ranks."""
    return allreduce(tf.stop_gradient(tf.convert_to_tensor(tensor)), op=Average, name=name)


def broadcast_variables(variables: Sequence[Any], root_rank: int, name: Optional[str] = None,
                        process_set: Optional[ProcessSet] = None):
    """Assigns ``root_rank``'s values to ``variables`` on every rank (of ``process_set``), in place.

    Works with ``tf.Variable`` and Keras 3 variables. All variables travel in one
    request. Returns the grouped assign op in graph mode, ``None`` eagerly.
    """
    variables = list(variables)
    values = grouped_broadcast([tf.convert_to_tensor(v) for v in variables], root_rank, name=name,
                               process_set=process_set)
    assigns = [v.assign(value) for v, value in zip(variables, values)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_(variables: Sequence[Any], root_rank: int, name: Optional[str] = None, process_set: Optional[ProcessSet] = None) -> list:
    """Horovod's in-place broadcast: assigns ``root_rank``'s values to ``variables`` and returns them.

    Args:
        variables: ``tf.Variable`` or Keras 3 variables, the same list on every rank.
        root_rank: the rank whose values everyone takes.
        name: name used to match the request across ranks.
        process_set: the ``ProcessSet`` to broadcast among (``None``: all ranks).

    Returns:
        ``variables``, now holding the root's values (eagerly); in a graph, their values
        read after the assignment.
    """
    variables = list(variables)
    assigned = broadcast_variables(variables, root_rank, name=name, process_set=process_set)
    if assigned is None:
        return variables
    # In a graph (tf.compat.v1 sessions included) the reads must wait for the assignment.
    with tf.control_dependencies([assigned]):
        return [tf.identity(v) for v in variables]


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """Horovod's TF1 spelling: broadcasts ``tf.compat.v1.global_variables()`` from ``root_rank``.

    Only meaningful when building a ``tf.compat.v1`` graph: eager TensorFlow 2 and Keras 3
    have no global variable collection, so eagerly this raises, as Horovod does.

    Raises:
        RuntimeError: when executing eagerly; use ``broadcast_variables(model.variables +
            optimizer.variables, root_rank)`` there (or ``smdist_tf.keras.broadcast_global_variables``).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() needs a tf.compat.v1 graph: eager TensorFlow 2 has no global variables. "
            "Use broadcast_variables(model.variables + optimizer.variables, root_rank) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# ---------------------------------------------------------------------------
# Gradients. Each runs collectives, so every rank must differentiate the same
# graph; that holds when all ranks run the same training step.
# ---------------------------------------------------------------------------


def _zeros_for_missing(grads, inputs) -> list:
    return [g if g is not None else tf.zeros_like(x) for g, x in zip(grads, inputs)]


# Every collective op's last input is its name (no gradient): gradient functions
# work on the data inputs, op.inputs[:-1], and return None for the name.


def _op_process_set(op) -> Optional[ProcessSet]:
    """The process set a collective op ran on, for the collectives of its gradient."""
    psid = op.get_attr("process_set_id")
    return None if psid == 0 else _process_sets.process_set_by_id(psid)


@tf.RegisterGradient("SmdistAllreduce")
def _allreduce_grad(op, *grads):
    reduce_op = op.get_attr("reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    psid = op.get_attr("process_set_id")
    xs, ys = list(op.inputs[:-1]), list(op.outputs)
    grads = _zeros_for_missing(grads, xs)
    if reduce_op in (Sum, Average):
        # d(sum_r pre*x_r)/dx_r = pre; upstream gradients add up over ranks (compressed like the forward).
        return _allreduce_dense(grads, reduce_op, pre, post, None, op.get_attr("compression").decode(), psid) + [None]
    if reduce_op == Adasum:
        # Adasum reduces gradients; differentiating through it is not something training needs.
        raise NotImplementedError("the gradient of allreduce with op=Adasum is not implemented")
    summed = _allreduce_dense(grads, Sum, 1.0, 1.0, None, "none", psid)
    if reduce_op in (Min, Max):
        return list(_extremum_grads(xs, ys, summed, reduce_op, pre, post, psid)) + [None]
    return list(_product_grads(xs, summed, pre, post, psid)) + [None]


def _extremum_grads(xs, ys, summed, reduce_op, pre, post, psid):
    """The gradient flows to the ranks holding the extreme value, split evenly among ties."""
    scaled = [x * tf.cast(pre, x.dtype) for x in xs]
    if post != 1.0:
        raw = _allreduce_dense(scaled, reduce_op, 1.0, 1.0, None, "none", psid)
    else:
        raw = ys if pre == 1.0 else _allreduce_dense(scaled, reduce_op, 1.0, 1.0, None, "none", psid)
    masks = [tf.cast(tf.equal(s, r), s.dtype) for s, r in zip(scaled, raw)]
    counts = _allreduce_dense(masks, Sum, 1.0, 1.0, None, "none", psid)
    return [g * m * tf.cast(pre * post, g.dtype) / tf.maximum(c, tf.ones_like(c)) for g, m, c in zip(summed, masks, counts)]


def _product_grads(xs, summed, pre, post, psid):
    """d(prod_s pre*x_s)/dx_r is pre times the product of the other ranks' factors, zeros handled exactly."""
    out = []
    for x, g in zip(xs, summed):
        if not x.dtype.is_floating:
            out.append(None)
            continue
        scaled = x * tf.cast(pre, x.dtype)
        is_zero = tf.equal(scaled, tf.zeros_like(scaled))
        safe = tf.where(is_zero, tf.ones_like(scaled), scaled)
        (nonzero_product,) = _allreduce_dense([safe], Product, 1.0, 1.0, None, "none", psid)
        (zero_count,) = _allreduce_dense([tf.cast(is_zero, x.dtype)], Sum, 1.0, 1.0, None, "none", psid)
        others = tf.where(
            is_zero,
            tf.where(tf.equal(zero_count, 1), nonzero_product, tf.zeros_like(scaled)),
            tf.where(tf.equal(zero_count, 0), nonzero_product / safe, tf.zeros_like(scaled)),
        )
        out.append(g * others * tf.cast(pre * post, x.dtype))
    return out


@tf.RegisterGradient("SmdistBroadcast")
def _broadcast_grad(op, *grads):
    # Horovod's gradient: the upstream gradients averaged over ranks, kept by the root only.
    root = op.get_attr("root_rank")  # a rank of the job, like rank()
    grads = _zeros_for_missing(grads, op.inputs[:-1])
    averaged = _allreduce_dense(grads, Average, 1.0, 1.0, None, "none", op.get_attr("process_set_id"))
    if rank() == root:
        return averaged + [None]
    # Zeros that still wait for the allreduce: every rank must run it, even
    # where nothing reads its value (a pruned collective would hang the root).
    with tf.control_dependencies(averaged):
        return [tf.zeros_like(g) for g in grads] + [None]


@tf.RegisterGradient("SmdistAllgather")
def _allgather_grad(op, grad):
    # Horovod's gradient: the upstream gradient averaged over ranks, then this rank's rows.
    x = op.inputs[0]
    process_set = _op_process_set(op)
    averaged = _allreduce_dense([grad], Average, 1.0, 1.0, None, "none", op.get_attr("process_set_id"))[0]
    rows = allgather(tf.shape(x, out_type=tf.int64)[:1], process_set=process_set)
    position = rank() if process_set is None else process_set.rank()
    start = tf.reduce_sum(rows[:position])
    begin = tf.concat([[start], tf.zeros([tf.rank(x) - 1], tf.int64)], axis=0)
    return [tf.slice(averaged, begin, tf.shape(x, out_type=tf.int64)), None]


@tf.RegisterGradient("SmdistAlltoall")
def _alltoall_grad(op, grad, _received_splits_grad):
    if grad is None:
        grad = tf.zeros_like(op.outputs[0])
    back, _ = alltoall(grad, splits=op.outputs[1], process_set=_op_process_set(op))
    return [back, None, None]


@tf.RegisterGradient("SmdistReducescatter")
def _reducescatter_grad(op, grad):
    # Horovod 0.28 scales the gathered gradient by size() for Sum and leaves it as is for
    # Average (its tests expect exactly that); the scale factors apply as in the forward.
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of reducescatter with {reduce_ops.op_name(reduce_op)} is not implemented")
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    process_set = _op_process_set(op)
    if reduce_op == Sum:
        scale *= size() if process_set is None else process_set.size()
    gathered = allgather(grad, process_set=process_set)
    return [gathered * tf.cast(scale, gathered.dtype) if scale != 1.0 else gathered, None]


tf.no_gradient("SmdistBarrier")
tf.no_gradient("SmdistJoin")
