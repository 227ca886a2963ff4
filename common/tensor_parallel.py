"""Tensor parallelism (Megatron-LM's, Shoeybi et al. 2019), through DTensor's `parallelize_module`.

Within each of a Transformer's blocks, the first linear layer of a pair is split by its output
columns (each rank computes its share of the hidden units, or its heads of the attention) and the
second by its input rows (each rank's partial product, summed over the ranks by one all-reduce):
one all-reduce in forward and one in backward per pair, and each rank holds 1/N of the pair's
weights. A paper says which layers are which in its spec's `tp_plan`, paths within each of its
blocks (`shard_blocks`) mapped to a kind:

    colwise      split by output columns (the attention's W_q, W_k, W_v; the MLP's first layer); an
                 nn.Embedding by its vectors' columns (Swin's relative position bias table, one
                 column per head)
    colwise-qkv  a fused q, k, v matrix (W_qkv): split by columns within each of the three, so
                 that a rank holds whole heads of each
    rowwise      split by input rows (the attention's W_o; the MLP's second layer)
    norm         a pre-norm block's layer norm (at a sub-layer's input): whole on every rank, or with
                 --sequence-parallel where the sequence is split

The attention then runs on the rank's own heads: the models count their heads from the width they
are given. Everything outside the plan (embeddings, norms, the head) stays whole on every rank.

Sequence parallelism (Korthikanti et al. 2022, `--sequence-parallel`): between the pairs, where
every rank would compute the same thing (the norms, the residual adds, the dropouts), each rank
takes its share of the positions instead. A block splits its input along the sequence; a norm
normalises its own positions and gathers the whole sequence for the column-wise layers after it;
a row-wise layer's partial sums are reduce-scattered (not all-reduced) back to the rank's positions;
the block gathers its output. The activations between the pairs take 1/N of the memory; the
communication is the same in volume. A dropout there draws for the rank's positions only, so with
dropout on the numbers differ from one process's.
"""

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard

KINDS = ("colwise", "rowwise", "colwise-qkv", "norm")


class FusedColwiseParallel(ColwiseParallel):
    """Column-wise for a linear layer whose output is `parts` matrices side by side: each rank takes
    its share of every part (DTensor's strided sharding), and its output is its columns of each
    part, side by side."""

    def __init__(self, parts: int = 3):
        super().__init__(output_layouts=_StridedShard(-1, split_factor=parts))
        self.parts = parts

    def _partition_linear_fn(self, name, module, device_mesh):
        # the weight split by strides; the bias whole on every rank (each adds its share of it), so that
        # fsdp beside can shard the weight by its other dimension and the bias by its only one
        weight = distribute_tensor(module.weight, device_mesh, [_StridedShard(0, split_factor=self.parts)])
        module.register_parameter("weight", nn.Parameter(weight, requires_grad=module.weight.requires_grad))
        if module.bias is not None:
            bias = distribute_tensor(module.bias, device_mesh, [Replicate()])
            module.register_parameter("bias", nn.Parameter(bias, requires_grad=module.bias.requires_grad))


def style(kind: str, sequence_parallel: bool = False):
    if kind == "colwise":
        return ColwiseParallel()
    if kind == "rowwise":  # with the sequence split, the partial sums are reduce-scattered over the positions
        return RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
    if kind == "colwise-qkv":
        return FusedColwiseParallel(3)
    raise ValueError(f"unknown tensor-parallel kind '{kind}'; choose from: {', '.join(KINDS)}")


def split_sizes(model: nn.Module, shard_blocks: str, plan: dict[str, str]) -> dict[str, int]:
    """Each planned layer's size that the ranks divide (its output columns, per part for colwise-qkv,
    or its input rows), by path."""
    sizes = {}
    for i, block in enumerate(model.get_submodule(shard_blocks)):
        for path, kind in plan.items():
            if kind != "norm" and _has(block, path):
                layer = block.get_submodule(path)
                rows, cols = layer.weight.shape
                if isinstance(layer, nn.Embedding):  # (entries, dim): colwise splits the vectors' dim
                    rows, cols = cols, rows
                sizes[f"{shard_blocks}.{i}.{path}"] = cols if kind == "rowwise" else rows // (3 if kind == "colwise-qkv" else 1)
    return sizes


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False


def apply(model: nn.Module, shard_blocks: str, plan: dict[str, str], mesh: DeviceMesh,
          sequence_parallel: bool = False) -> nn.Module:
    """Split the planned layers of every block over `mesh` (1-D, the tensor-parallel ranks), in place;
    with `sequence_parallel`, split the positions between them too. A path of the plan that a block
    does not have (a decoder's cross-attention in an encoder layer) is skipped there."""
    for block in model.get_submodule(shard_blocks):
        layers = {path: style(kind, sequence_parallel) for path, kind in plan.items()
                  if kind != "norm" and _has(block, path)}
        parallelize_module(block, mesh, layers)
        if sequence_parallel:
            _split_sequence(block, [block.get_submodule(p) for p, k in plan.items() if k == "norm" and _has(block, p)],
                            mesh)
    return model


def _split_sequence(block: nn.Module, norms: list[nn.Module], mesh: DeviceMesh) -> None:
    """The block reads and returns the whole sequence (B, T, ...) and works on its share of the positions
    in between: it splits its input, its norms gather their outputs (the layers after them read every
    position), its row-wise layers scatter theirs, and it gathers its output (a tuple's first element)."""
    positions = {}  # T of the block's input, which the gathers restore

    def whole(local: torch.Tensor) -> DTensor:
        shape = (local.shape[0], positions["T"], *local.shape[2:])
        return DTensor.from_local(local, mesh, [Shard(1)], run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())

    def split(module, args, kwargs):
        positions["T"] = args[0].shape[1]
        share = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(1)])
        return (share.to_local(), *args[1:]), kwargs

    def gather(module, args, kwargs, output):
        first = output[0] if isinstance(output, tuple) else output
        first = whole(first).redistribute(mesh, [Replicate()]).to_local()
        return (first, *output[1:]) if isinstance(output, tuple) else first

    block.register_forward_pre_hook(split, with_kwargs=True)
    block.register_forward_hook(gather, with_kwargs=True)
    for norm in norms:  # its weights whole on every rank; their gradients summed over the ranks' positions
        distribute_module(norm, mesh, input_fn=lambda m, inputs, mesh: (whole(inputs[0]),),
                          output_fn=lambda m, output, mesh: output.redistribute(mesh, [Replicate()]).to_local())


def fsdp_placement(param):
    """Where fsdp beside tensor parallelism shards a parameter: a strided weight by its columns (its rows
    are split by strides already, which two strided splits of one dimension cannot describe), the rest
    as fsdp does (None: by rows)."""
    return Shard(1) if is_strided(param) else None


def is_strided(t) -> bool:
    """A DTensor sharded with strides (a colwise-qkv weight), which DCP cannot save as shards."""
    return isinstance(t, DTensor) and any(isinstance(p, _StridedShard) for p in t.placements)


def check(spec, cfg, model) -> None:
    """Tensor parallelism's checks of a config (common.config.validate asks them, with --tp or
    --sequence-parallel): a paper with a plan, every layer it splits divisible by --tp; with
    --sequence-parallel, --tp and blocks whose norms sit at their sub-layers' inputs."""
    from common.errors import ConfigError
    from papers import get_paper, list_papers

    tp = cfg.tp
    if tp > 1:
        if not spec.tp_plan:
            having = ", ".join(name for name in sorted(list_papers()) if get_paper(name).tp_plan)
            raise ConfigError(f"--tp splits the layers a paper's tp_plan names; {spec.name} has none (papers with "
                              f"one: {having})")
        for path, size in split_sizes(model, spec.shard_blocks, spec.tp_plan).items():
            if size % tp:
                raise ConfigError(f"--tp {tp}: {path} splits {size} units (heads x width, or hidden units), "
                                  f"which do not divide by {tp}")
    if cfg.sequence_parallel:
        _check_sequence_parallel(spec, cfg, model)


def _check_sequence_parallel(spec, cfg, model) -> None:
    from common.errors import ConfigError

    if cfg.tp < 2:
        raise ConfigError("--sequence-parallel splits the positions between tensor-parallel ranks; add --tp N")
    if "norm" not in spec.tp_plan.values():
        raise ConfigError(f"--sequence-parallel splits the positions at a block's pre-norms; {spec.name}'s plan "
                          f"names none (its blocks normalise after their sub-layers)")
    if not all(getattr(block, "pre_norm", True) for block in model.get_submodule(spec.shard_blocks)):
        raise ConfigError(f"--sequence-parallel splits the positions at a block's pre-norms; {spec.name} "
                          f"{cfg.flavor}'s blocks normalise after their sub-layers (post-norm)")
