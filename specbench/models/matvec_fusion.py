"""One call of specbench's weight-only kernels per shared input: q/k/v, and gate/up, as one op each.

A decode step calls `cpu_matvec`'s (or `cpu_bf16`'s) ops 7 times a layer; 3 of them (q, k, v) read the same input, and
2 (gate, up) another. Each call costs a dispatch from inductor's wrapper, a fork/join of the threads and
the ramp of a fresh weight stream, which a small k/v projection (83 KB in int4) never outruns. This
inductor post-grad pass (torch's custom-pass hook, `torch._inductor.config.post_grad_custom_pre_pass`)
rewrites such calls into one over the concatenated weights plus a split. It runs after freezing, when the
weights are graph constants, so the concatenation is made once per compile; the model is untouched and
the eager path keeps its separate calls.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections import defaultdict

import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

NAMESPACE = "specbench"  # the ops `cpu_matvec` registers: every tensor after x is a weight [N, ...] part
FUSABLE = ("int8_matvec", "int4_matvec", "bf16_matvec")  # x [M, K] first, outputs [M, N] (not attention)


def _is_matvec(node: torch.fx.Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):  # a traced call names the packet, inductor's the overload
        target = target.default
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == NAMESPACE
        and target.__name__.split(".")[0] in FUSABLE
        and any(isinstance(a, torch.fx.Node) for a in node.args[1:])
        and all(a.op == "get_attr" for a in node.args[1:] if isinstance(a, torch.fx.Node))
    )


def _weights(node: torch.fx.Node) -> list[int]:
    """Positions of the call's weight parts (graph constants); its other arguments (None bias, isa) are plain."""
    return [i for i, a in enumerate(node.args) if i and isinstance(a, torch.fx.Node)]


def fuse_shared_inputs(graph: torch.fx.Graph) -> int:
    """Rewrite each group of same-op calls on one input node into one call and a split; returns the
    number of calls removed (also counted in torch._dynamo.utils.counters["specbench"])."""
    gm = graph.owning_module
    groups: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        if _is_matvec(node):
            plain = tuple((i, a) for i, a in enumerate(node.args) if i and not isinstance(a, torch.fx.Node))
            groups[(node.target, node.args[0], plain)].append(node)
    removed = 0
    for (op, x, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        first = nodes[0]
        positions = _weights(first)
        parts = [[getattr(gm, node.args[i].target) for i in positions] for node in nodes]
        sizes = [p[0].shape[0] for p in parts]  # output features per call
        with graph.inserting_before(first):
            weights = []
            for i, pieces in zip(positions, zip(*parts)):
                name = f"{first.args[i].target}_fused"
                gm.register_buffer(name, torch.cat(pieces, 0).contiguous())
                weights.append(graph.get_attr(name))
            args = list(first.args)
            for i, weight in zip(positions, weights):
                args[i] = weight
            call = graph.call_function(op, tuple(args))
            split = graph.call_function(torch.ops.aten.split_with_sizes.default, (call, sizes, 1))
            outs = [graph.call_function(operator.getitem, (split, i)) for i in range(len(nodes))]
        if "val" in x.meta:  # inductor's later passes read the nodes' fake values
            _set_fake_values(gm, x, weights, call, split, outs, sizes)
        for node, out in zip(nodes, outs):
            separate = [node.args[i] for i in positions]
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            for weight in separate:
                if not weight.users:
                    graph.erase_node(weight)
        removed += len(nodes) - 1
    if removed:
        counters["specbench"]["fused_matvec_calls"] += removed
    return removed


def _set_fake_values(
    gm: torch.fx.GraphModule,
    x: torch.fx.Node,
    weights: list[torch.fx.Node],
    call: torch.fx.Node,
    split: torch.fx.Node,
    outs: list[torch.fx.Node],
    sizes: list[int],
) -> None:
    fake_mode = torch._guards.detect_fake_mode([x.meta["val"]])
    with fake_mode:
        for node in weights:
            node.meta["val"] = fake_mode.from_tensor(getattr(gm, node.target))
        call.meta["val"] = call.target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in call.args))
        split.meta["val"] = torch.ops.aten.split_with_sizes.default(call.meta["val"], sizes, 1)
        for i, out in enumerate(outs):
            out.meta["val"] = split.meta["val"][i]


class FuseSharedInputs(CustomGraphPass):
    """`fuse_shared_inputs` as inductor's custom pass. Its uuid keys inductor's FX graph cache, whose entries
    keep the fused weights the pass made, so it is this file's hash and `weights`: the fingerprint of the model
    being compiled (`weights_fingerprint`), which its caller sets before any call that may compile. Keyed on the
    code alone, a model with another's shapes got that model's cache entry and ran its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = ""

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_shared_inputs(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,)) + self.weights.encode()


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A content hash of a CPU module's buffers (where weight-only layers keep what the pass concatenates) and
    parameters (bf16 linears' weights, which `cpu_bf16`'s calls take): 0.13 s for the 108 MB `w4a16h8` draft's
    buffers, once per compiled model."""
    digest = hashlib.blake2b(digest_size=16)
    for name, t in itertools.chain(module.named_buffers(), module.named_parameters()):
        if t.device.type != "cpu":  # the ops are CPU ops: nothing on another device is fused
            continue
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


FUSION_PASS = FuseSharedInputs()
