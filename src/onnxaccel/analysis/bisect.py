"""Find the first node where two targets (or precisions) of one model diverge.

Marking every tensor as an output at once multiplies memory and breaks fusions (NVIDIA/TensorRT#3161, where
the maintainers recommend bisection instead). So this exposes a few intermediate tensors per session and
searches along the topological order:

1. Run both targets once; pick the diverging output produced earliest.
2. Take its ancestors in topological order. The output is known bad; probe ``per_session`` tensors spread
   over the unknown span, keep the span between the last good and the first bad probe, repeat. That takes
   about log_{per_session+1}(N) rounds of two sessions.
3. Check the inputs of the node that produces the first bad tensor. If one of them diverges too (the order
   interleaves independent branches, so the search can land downstream of the real cause), restart from
   that input; otherwise this node is where the divergence starts.

What "diverges" means for a tensor: the candidate has NaN/Inf where the reference has none, or the tensor's
relative L2 error ``||b - a|| / ||a||`` exceeds ``rtol`` while its largest absolute error exceeds ``atol``.
The element-wise test that decides pass/fail for outputs is too strict for intermediates: FP16 rounding
accumulates through a network, and an element near zero fails ``atol + rtol * |a|`` long before anything
has broken. The tensor-level test stays quiet through ordinary rounding and jumps where a node breaks (an
overflow, a clamped constant, a normalization whose statistics FP16 cannot hold).

Tensors are matched by name. An FP16 model made by ``convert_float_to_float16`` keeps the names of node
outputs and adds Cast nodes with new names (onnxruntime/transformers/float16.py), so only tensors of the
reference graph that the other graph also produces are candidates, and the Casts are never blamed.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxaccel.compare import OutputComparison, check_tolerances, compare_array
from onnxaccel.analysis.graph_stats import inferred_tensors
from onnxaccel.engines import Runner, compile_model
from onnxaccel.errors import ModelError
from onnxaccel.model import Model
from onnxaccel.target import Target
from onnxaccel.precision import prepare_for_target

SCHEMA = "onnxaccel.bisect/1"

_PROTOBUF_LIMIT = 2**31 - 1  # protobuf's hard limit on one serialized message
_FP16_MAX = float(np.finfo(np.float16).max)  # 65504
_FP16_TINY = float(np.finfo(np.float16).smallest_subnormal)  # 5.96e-08
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.BFLOAT16}


@dataclass(frozen=True)
class TensorCheck:
    """One tensor compared between the two targets during bisection, with the tolerances it was judged by."""
    tensor: str
    node: str
    op_type: str
    position: int
    comparison: OutputComparison

    atol: float = 0.0
    rtol: float = 0.0

    @property
    def passed(self) -> bool:
        """True when the two targets agree on this tensor within atol/rtol."""
        return not diverges(self.comparison, atol=self.atol, rtol=self.rtol)

    def to_dict(self) -> dict:
        """JSON-ready form of the check, as written under ``checked``/``inputs`` in the bisect report."""
        c = self.comparison
        return {"tensor": self.tensor, "node": self.node, "op_type": self.op_type, "position": self.position,
                "passed": self.passed, "rel_l2": c.rel_l2, "max_abs": c.max_abs, "max_rel": c.max_rel,
                "mismatched": c.mismatched, "nan": c.nan[1], "inf": c.inf[1]}


def diverges(c: OutputComparison, *, atol: float, rtol: float) -> bool:
    """The tensor-level test bisection uses (see the module docstring)."""
    if c.shape != c.candidate_shape:
        return True
    if c.nan[1] + c.inf[1] > c.nan[0] + c.inf[0]:
        return True
    return c.rel_l2 > rtol and c.max_abs > atol


@dataclass(frozen=True)
class DivergenceResult:
    """Outcome of a bisection: the first node whose output diverges between two targets, or why none was found."""
    found: bool
    target_a: str
    target_b: str
    atol: float
    rtol: float
    message: str
    node: str | None = None
    op_type: str | None = None
    domain: str | None = None
    tensor: str | None = None
    position: int | None = None
    error: OutputComparison | None = None
    inputs: tuple[TensorCheck, ...] = ()
    checked: tuple[TensorCheck, ...] = ()
    sessions: int = 0
    candidates: int = 0
    #: Why the node may break: weights it reads that FP16 cannot represent.
    causes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """JSON-ready report (schema ``SCHEMA``) for ``compare --bisect --json``."""
        return {
            "schema": SCHEMA, "found": self.found, "target_a": self.target_a, "target_b": self.target_b,
            "atol": self.atol, "rtol": self.rtol, "message": self.message, "node": self.node,
            "op_type": self.op_type, "domain": self.domain, "tensor": self.tensor, "position": self.position,
            "error": self.error.to_dict() if self.error else None,
            "inputs": [c.to_dict() for c in self.inputs], "checked": [c.to_dict() for c in self.checked],
            "sessions": self.sessions, "candidates": self.candidates, "causes": list(self.causes),
            "notes": list(self.notes),
        }


def find_divergence(
    model: Model,
    target_a: Target,
    target_b: Target,
    feeds: Mapping[str, np.ndarray],
    *,
    atol: float,
    rtol: float,
    per_session: int = 4,
    max_rounds: int = 64,
) -> DivergenceResult:
    """Name the first node whose output diverges between ``target_a`` (the reference) and ``target_b`` while
    its inputs still agree (``diverges``: new NaN/Inf, or relative L2 error above ``rtol`` with an absolute
    error above ``atol``). The search starts only when an output fails ``compare_array``'s element-wise test.

    Either target may carry a precision its provider cannot switch to by itself (fp16 on cpu/cuda): the model
    is converted as ``run``/``compare`` do, and tensors are matched by name. Sessions are built one at a time
    and closed after each run; ``feeds`` must fit the model's bound shapes. The result's ``node`` is what an
    automatic mixed-precision pass keeps in FP32; call again on the fixed model to find the next one.
    """
    check_tolerances(atol, rtol)
    if per_session < 1:
        raise ValueError("per_session must be at least 1")
    if not model.is_bound:
        model = model.bind()
    with _Prober(model, target_a, target_b, feeds, atol, rtol) as prober:
        return _search(prober, per_session, max_rounds)


class _Prober:
    """Runs both sides with a few extra outputs exposed, and remembers every comparison."""

    def __init__(self, model: Model, target_a: Target, target_b: Target, feeds, atol: float, rtol: float):
        self.reference = model
        self.feeds = dict(feeds)
        self.atol, self.rtol = atol, rtol
        self.targets = (target_a, target_b)
        self.sessions = 0
        self.checked: dict[str, TensorCheck] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="onnxaccel-bisect-")
        self.sides = []
        self.outputs = []
        for label, target in zip("ab", self.targets):
            runnable, engine_target = prepare_for_target(model, target)
            runner = compile_model(runnable, engine_target)
            try:
                self.outputs.append(runner.run(self.feeds))
            finally:
                runner.close()
            self.sessions += 1
            self.sides.append(_Side(label, _with_inline_data(runner.model), engine_target))
        graph = model.proto.graph
        self.producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
        types = inferred_tensors(model)
        produced_by_both = set.intersection(*(s.produced for s in self.sides))
        self.candidates = [
            out for n in graph.node if n.op_type != "Constant" for out in n.output
            if out and out in produced_by_both and types.get(out, (onnx.TensorProto.FLOAT, None))[0] in _FLOAT_TYPES
        ]
        self.candidate_set = set(self.candidates)

    def __enter__(self) -> _Prober:
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    def check(self, names: Sequence[str]) -> dict[str, TensorCheck]:
        todo = [n for n in dict.fromkeys(names) if n not in self.checked]
        if todo:
            values = [side.run(todo, self.feeds, self._tmp.name, self.sessions) for side in self.sides]
            self.sessions += 2
            for name in todo:
                node = self.reference.proto.graph.node[self.producer[name]]
                comparison = compare_array(name, values[0][name], values[1][name], atol=self.atol, rtol=self.rtol,
                                           topk=0)
                self.checked[name] = TensorCheck(name, node.name or node.op_type, node.op_type,
                                                 self.producer[name], comparison, self.atol, self.rtol)
        return {n: self.checked[n] for n in names}

    def ancestors(self, tensor: str) -> set[str]:
        graph = self.reference.proto.graph
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            i = self.producer.get(name)
            if i is None or name in seen:
                continue
            seen.add(name)
            stack.extend(n for n in graph.node[i].input if n)
        return seen


@dataclass
class _Side:
    label: str
    model: Model
    target: Target

    @property
    def produced(self) -> set[str]:
        return {out for n in self.model.proto.graph.node for out in n.output if out}

    def run(self, names: list[str], feeds, tmp: str, serial: int) -> dict[str, np.ndarray]:
        graph = self.model.proto.graph
        existing = {o.name for o in graph.output}
        added = [n for n in names if n not in existing]
        graph.output.extend(onnx.ValueInfoProto(name=n) for n in added)
        path = os.path.join(tmp, f"{self.label}-{serial}.onnx")
        try:
            onnx.save(self.model.proto, path)
        finally:
            del graph.output[len(graph.output) - len(added):]
        runner: Runner = compile_model(dataclasses.replace(self.model, path=Path(path)), self.target)
        try:
            return runner.run(feeds)
        finally:
            runner.close()
            os.remove(path)


def _with_inline_data(model: Model) -> Model:
    """The runtime model with every weight in its proto, so copies with extra outputs can be saved anywhere.

    Self-contained models already are (``load_external_data=False`` only skips external files); the proto is
    then shared, and ``_Side.run`` restores its outputs after each save.
    """
    if any(onnx.external_data_helper.uses_external_data(t) for t in model.proto.graph.initializer):
        model = dataclasses.replace(model, proto=onnx.load(str(model.path), load_external_data=True))
    if model.proto.ByteSize() > _PROTOBUF_LIMIT:
        raise ModelError(
            f"{model.source} is larger than 2 GB; bisection saves modified copies of it as one protobuf, which "
            "cannot exceed 2 GB.",
            "Bisect a smaller variant of the model (fewer layers), or compare its outputs without --bisect.",
        )
    return model


def _search(prober: _Prober, per_session: int, max_rounds: int) -> DivergenceResult:
    ta, tb = (str(t) for t in prober.targets)
    common = dict(target_a=ta, target_b=tb, atol=prober.atol, rtol=prober.rtol)
    out_a, out_b = prober.outputs
    compared = {n: compare_array(n, out_a[n], out_b[n], atol=prober.atol, rtol=prober.rtol, topk=0)
                for n in out_a if n in out_b}
    failing = [n for n, c in compared.items() if not c.passed]
    bad_outputs = [n for n in failing if diverges(compared[n], atol=prober.atol, rtol=prober.rtol)]
    notes = ("Exposing a tensor as an output keeps ONNX Runtime from fusing across it; a divergence that only "
             "a fused kernel causes may move or vanish under bisection.",)
    if not failing:
        return DivergenceResult(False, message="The outputs agree within tolerance; nothing diverges.",
                                sessions=prober.sessions, candidates=len(prober.candidates), notes=notes, **common)
    if not bad_outputs:
        worst = max(compared[n].rel_l2 for n in failing)
        return DivergenceResult(
            False, message=f"Output(s) {', '.join(failing)} fail element-wise, but their relative L2 error "
            f"(at most {worst:.3g}) is within rtol={prober.rtol:g}: rounding accumulated over the whole graph, "
            "not one node that breaks. Loosen --atol/--rtol, or keep more of the model in the higher precision.",
            sessions=prober.sessions, candidates=len(prober.candidates), notes=notes, **common)
    start = min((n for n in bad_outputs if n in prober.producer), key=lambda n: prober.producer[n], default=None)
    if start is None or start not in prober.candidate_set:
        return DivergenceResult(False, message=f"Output(s) {', '.join(bad_outputs)} diverge, but no intermediate "
                                "tensor can be matched between the two graphs.", sessions=prober.sessions,
                                candidates=len(prober.candidates), notes=notes, **common)
    graph = prober.reference.proto.graph
    bad = start
    for _ in range(max_rounds):
        ancestry = prober.ancestors(bad)
        span = [t for t in prober.candidates if t in ancestry]
        lo, hi = -1, span.index(bad)
        while hi - lo > 1:
            inner = list(range(lo + 1, hi))
            picks = _spread(inner, per_session)
            results = prober.check([span[i] for i in picks])
            first_bad = next((i for i in picks if not results[span[i]].passed), None)
            if first_bad is None:
                lo = picks[-1]
            else:
                lo = max((i for i in picks if i < first_bad), default=lo)
                hi = first_bad
        culprit = span[hi]
        node = graph.node[prober.producer[culprit]]
        node_inputs = [t for t in node.input if t in prober.candidate_set]
        input_checks = prober.check(node_inputs) if node_inputs else {}
        diverging = [t for t in node_inputs if not input_checks[t].passed]
        if diverging:
            bad = min(diverging, key=lambda t: prober.producer[t])
            continue
        error = prober.checked[culprit].comparison if culprit in prober.checked else compared[culprit]
        name = node.name or f"{node.op_type}_{prober.producer[culprit]}"
        new_special = error.nan[1] + error.inf[1] - error.nan[0] - error.inf[0]
        what = (f"{new_special} NaN/Inf value(s) appear" if new_special > 0 else
                f"relative L2 error {error.rel_l2:.3g} (> rtol {prober.rtol:g}), up to {error.max_abs:.4g} absolute")
        return DivergenceResult(
            True, message=f"First divergence at node '{name}' ({node.op_type}): in its output '{culprit}' {what}, "
            "while its inputs agree.",
            node=name, op_type=node.op_type, domain=node.domain, tensor=culprit,
            position=prober.producer[culprit], error=error, inputs=tuple(input_checks.values()),
            checked=tuple(sorted(prober.checked.values(), key=lambda c: c.position)), sessions=prober.sessions,
            candidates=len(prober.candidates), causes=_fp16_range_causes(graph, node), notes=notes, **common)
    return DivergenceResult(False, message=f"Gave up after {max_rounds} rounds.", sessions=prober.sessions,
                            candidates=len(prober.candidates), notes=notes, **common)


def _fp16_range_causes(graph: onnx.GraphProto, node: onnx.NodeProto) -> tuple[str, ...]:
    """Weights of ``node`` with values FP16 cannot hold: above its largest finite value, or nonzero below its
    smallest subnormal (which convert_float_to_float16 clamps, onnxruntime/transformers/float16.py)."""
    values: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer if t.name in node.input}
    for n in graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] in node.input:
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = a.t
    causes = []
    for name, tensor in values.items():
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        try:
            array = np.abs(onnx.numpy_helper.to_array(tensor))
        except (ValueError, OSError):  # external data not loaded
            continue
        big = array[np.isfinite(array)].max(initial=0.0)
        tiny = array[(array > 0) & np.isfinite(array)].min(initial=np.inf)
        if big > _FP16_MAX:
            causes.append(f"'{name}' holds values up to {big:.4g}, above FP16's largest finite value {_FP16_MAX:g}")
        elif tiny < _FP16_TINY:
            causes.append(f"'{name}' holds nonzero values down to {tiny:.3g}, below FP16's smallest subnormal "
                          f"{_FP16_TINY:.3g}")
    return tuple(causes)


def _spread(indices: list[int], k: int) -> list[int]:
    """Up to ``k`` indices spread evenly over ``indices`` (all of them when there are k or fewer)."""
    if len(indices) <= k:
        return indices
    step = len(indices) / (k + 1)
    return sorted({indices[min(len(indices) - 1, int(step * (j + 1)))] for j in range(k)})
