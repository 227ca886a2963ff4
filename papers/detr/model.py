"""End-to-End Object Detection with Transformers.

Carion, Massa, Synnaeve, Usunier, Kirillov, Zagoruyko, 2020. https://arxiv.org/abs/2005.12872

Detection as direct set prediction: a CNN backbone, a Transformer encoder over its feature map and a
decoder that turns N learned object queries into N predictions (a class, possibly "no object", and a
box) in parallel (Fig. 2). A bipartite matching assigns each object to exactly one prediction
(matcher.py, loss.py), so there are no anchors, no proposals and no non-maximum suppression.

Padded batches: images are zero-padded at the bottom and right, and a mask (B, H, W) marks the valid
pixels. The ResNet backbone (papers/resnet) keeps the padding at zero and returns the mask of its
feature map; the positional encodings count only valid pixels, and the padding is masked out of the
encoder's keys and of the decoder's cross-attention. Boxes are normalised by each image's own size.
So every image gets the detections it gets alone.
"""

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from safetensors.torch import load_file
from torchvision.ops import box_convert, clip_boxes_to_image

from common.layers import masked
from papers.detr.loss import SetCriterion
from papers.detr.matcher import HungarianMatcher
from papers.resnet.model import FLAVORS as RESNET_FLAVORS
from papers.resnet.model import ResNet


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine parameters, all buffers: "the backbone is with
    ImageNet-pretrained ResNet model from torchvision with frozen batchnorm layers" (Section 4).
    A per-channel affine map; the padding is set back to zero, as MaskedBatchNorm2d does."""

    def __init__(self, num_features: int, eps: float = 1e-5, device: torch.device | None = None):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features, device=device))
        self.register_buffer("bias", torch.zeros(num_features, device=device))
        self.register_buffer("running_mean", torch.zeros(num_features, device=device))
        self.register_buffer("running_var", torch.ones(num_features, device=device))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scale = self.weight * torch.rsqrt(self.running_var + self.eps)  # (C,)
        shift = self.bias - self.running_mean * scale
        return masked(x * scale[:, None, None] + shift[:, None, None], mask)  # (B, C, H, W)


def freeze_batch_norm(module: nn.Module) -> None:
    """Replace every batch norm below `module` with a FrozenBatchNorm2d holding its statistics."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, child.eps, device=child.running_mean.device)
            for buffer in ("weight", "bias", "running_mean", "running_var"):
                getattr(frozen, buffer).copy_(getattr(child, buffer).detach())
            setattr(module, name, frozen)
        else:
            freeze_batch_norm(child)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BACKBONE_DIR = Path(__file__).parent  # where a flavor's pretrained backbone file lives (pretrain.py)


class Backbone(nn.Module):
    """The CNN of Section 3.2: a ResNet's stem and stages (papers/resnet) without its pooling and
    classifier, giving f (B, C, H/s, W/s) and the mask of its valid pixels. Images in [0, 1] are first
    normalised with ImageNet's mean and standard deviation (the reference's data pipeline does it),
    the padding kept at zero as the reference pads after normalising.

    Args:
        resnet: a papers.resnet flavor name (the paper: "torchvision-resnet50" or "-101", torchvision's
            ResNet that the reference loads, striding the 3x3 of its bottlenecks) or ResNet kwargs.
        frozen_bn: replace batch norm with FrozenBatchNorm2d (the paper's, with a pretrained backbone).
        trainable_stages: train only the last this many stages; the stem and the stages before them are
            frozen (the reference trains layer2-4 of the ResNet: 3). None: everything trains.
        in_chans: input channels.
        weights: a safetensors file of this backbone's pretrained weights (its state dict with trainable
            batch norm), loaded before batch norm is frozen; a bare name is looked up in papers/detr.
    """

    def __init__(self, resnet: str | dict, frozen_bn: bool, trainable_stages: int | None, in_chans: int = 3,
                 weights: str | None = None):
        super().__init__()
        if isinstance(resnet, str):
            if resnet not in RESNET_FLAVORS:
                raise ValueError(f"unknown ResNet flavor '{resnet}'; choose from: {', '.join(RESNET_FLAVORS)}")
            resnet = RESNET_FLAVORS[resnet]
        net = ResNet(**{**resnet, "num_classes": 1, "in_chans": in_chans})
        self.mean, self.std = IMAGENET_MEAN, IMAGENET_STD  # constants, not weights
        if in_chans != 3:  # their averages for other inputs
            self.mean, self.std = (sum(IMAGENET_MEAN) / 3,) * in_chans, (sum(IMAGENET_STD) / 3,) * in_chans
        self.stem, self.stages = net.stem, net.stages  # the classifier (net.fc) is dropped
        self.num_channels = net.num_features
        self.stride = (4 if net.stem.pool is not None else 1) * 2 ** (len(self.stages) - 1)
        if weights is not None and not net.stem.conv.weight.is_meta:  # built on the meta device: nothing to load
            self.load_state_dict(load_file(BACKBONE_DIR / weights))  # an absolute path replaces the folder
        if frozen_bn:
            freeze_batch_norm(self)
        if trainable_stages is not None:
            if not 0 <= trainable_stages <= len(self.stages):
                raise ValueError(f"trainable_stages must be in 0..{len(self.stages)}, got {trainable_stages}")
            for part in [self.stem, *self.stages[: len(self.stages) - trainable_stages]]:
                part.requires_grad_(False)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mean, std = images.new_tensor(self.mean)[:, None, None], images.new_tensor(self.std)[:, None, None]  # (C, 1, 1)
        x = masked((images - mean) / std, mask)  # normalised as torchvision's ResNets were trained; padding 0
        x, mask = self.stem(x, mask)  # (B, widths[0], H/4, W/4) for the imagenet stem
        for stage in self.stages:
            x, mask = stage(x, mask)  # each stage after the first halves H and W
        return x, mask  # (B, C, H/s, W/s), (B, H/s, W/s) or None


class PositionEmbeddingSine(nn.Module):
    """Fixed 2D positional encodings (Section 3.2, Appendix A.4): the sine and cosine encodings of
    Vaswani et al. for the row and for the column, d/2 channels each, of positions normalised to
    (0, 2 pi] by the image's own height and width. The positions are cumulative sums over the valid
    pixels, so the padding changes nothing at the valid ones.

    Args:
        num_pos_feats: channels per axis (d / 2).
        temperature: the base of the wavelengths (10000).
        scale: the normalised range (2 pi).
    """

    def __init__(self, num_pos_feats: int = 128, temperature: float = 10000.0, scale: float = 2 * math.pi):
        super().__init__()
        self.num_pos_feats, self.temperature, self.scale = num_pos_feats, temperature, scale

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """mask (B, h, w), True on valid pixels -> encodings (B, h, w, 2 num_pos_feats), (y then x)."""
        eps = 1e-6
        y = mask.cumsum(1, dtype=torch.float32)  # row 1..h_i on the valid pixels, (B, h, w)
        x = mask.cumsum(2, dtype=torch.float32)  # column 1..w_i
        y = y / (y[:, -1:, :] + eps) * self.scale  # divided by h_i: (0, 2 pi]
        x = x / (x[:, :, -1:] + eps) * self.scale  # divided by w_i
        i = torch.arange(self.num_pos_feats, dtype=torch.float32, device=mask.device)
        dim_t = self.temperature ** (2 * (i // 2) / self.num_pos_feats)  # wavelengths, a pair per frequency
        pos_x, pos_y = x[..., None] / dim_t, y[..., None] / dim_t  # (B, h, w, F)
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)  # sin, cos interleaved
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3)  # (B, h, w, 2F)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with queries, keys and values from different inputs: DETR adds the
    positions to queries and keys but not to values. Parameters as nn.MultiheadAttention holds them
    (one in-projection for q, k and v, an out-projection), so the reference's weights map one to one.

    Args:
        d_model: width d.
        num_heads: heads M; each has d / M channels.
        dropout: dropout on the attention weights.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"width {d_model} does not divide into {num_heads} heads")
        self.num_heads, self.dropout = num_heads, dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # W_q, W_k, W_v stacked
        self.out_proj = nn.Linear(d_model, d_model)  # W_o

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, N_q, d), key and value (B, N_k, d); key_mask (B, N_k), True on the keys to attend to."""
        W_q, W_k, W_v = self.in_proj.weight.chunk(3)
        b_q, b_k, b_v = self.in_proj.bias.chunk(3)
        q = rearrange(F.linear(query, W_q, b_q), "b n (h e) -> b h n e", h=self.num_heads)  # (B, M, N_q, d/M)
        k = rearrange(F.linear(key, W_k, b_k), "b n (h e) -> b h n e", h=self.num_heads)  # (B, M, N_k, d/M)
        v = rearrange(F.linear(value, W_v, b_v), "b n (h e) -> b h n e", h=self.num_heads)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, N_k)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, M, N_q, d/M)
        return self.out_proj(rearrange(a, "b h n e -> b n (h e)"))  # (B, N_q, d)


class FFN(nn.Sequential):
    """The position-wise feed-forward network: Linear, ReLU, dropout, Linear."""

    def __init__(self, d_model: int, dim_feedforward: int, dropout: float):
        super().__init__(nn.Linear(d_model, dim_feedforward), nn.ReLU(inplace=True), nn.Dropout(dropout),
                         nn.Linear(dim_feedforward, d_model))


class EncoderLayer(nn.Module):
    """A post-norm encoder layer (Fig. 10): self-attention with the positions added to its queries and
    keys ("added to the input of each attention layer", Section 3.2), then the FFN; each sub-layer
    adds its dropped-out output to its input and layer-normalises the sum."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = FFN(d_model, dim_feedforward, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """src, pos (B, hw, d); key_mask (B, hw), True on the valid pixels."""
        q = k = src + pos
        src = self.norm1(src + self.dropout1(self.self_attn(q, k, src, key_mask)))  # (B, hw, d)
        return self.norm2(src + self.dropout2(self.ffn(src)))


class DecoderLayer(nn.Module):
    """A post-norm decoder layer (Fig. 10): self-attention among the N objects, with the object queries
    added to its queries and keys; cross-attention to the encoder's memory, the object queries added
    to its queries and the spatial positions to its keys; then the FFN."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = FFN(d_model, dim_feedforward, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor,
                key_mask: torch.Tensor | None) -> torch.Tensor:
        """tgt, query_pos (B, N, d); memory, pos (B, hw, d); key_mask (B, hw), True on the valid pixels."""
        q = k = tgt + query_pos
        tgt = self.norm1(tgt + self.dropout1(self.self_attn(q, k, tgt)))  # (B, N, d)
        attended = self.cross_attn(tgt + query_pos, memory + pos, memory, key_mask)  # (B, N, d)
        tgt = self.norm2(tgt + self.dropout2(attended))
        return self.norm3(tgt + self.dropout3(self.ffn(tgt)))


class MLP(nn.Module):
    """The box head: a 3-layer perceptron with ReLU and hidden width d (Section 3.2, "FFNs")."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, num_layers: int = 3):
        super().__init__()
        dims = [d_in] + [d_hidden] * (num_layers - 1) + [d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


def image_sizes(images: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, 2) each image's valid height h_i and width w_i in pixels."""
    if mask is None:
        mask = images.new_ones(images.shape[0], images.shape[2], images.shape[3], dtype=torch.bool)
    return torch.stack([mask.any(2).sum(1), mask.any(1).sum(1)], dim=1)  # (B, 2)


class DETR(nn.Module):
    """DETR: backbone, encoder, decoder and prediction heads (Fig. 2, Section 3.2).

    Args:
        num_classes: object classes K; the classifier has K + 1 outputs, the last one no-object
            (91 for COCO's category ids, as the reference).
        backbone: the ResNet (see `Backbone`): a papers.resnet flavor name or ResNet kwargs.
        backbone_weights: its pretrained weights (see `Backbone`): tiny's file, written by pretrain.py.
            None: the backbone starts from its own initialisation (the paper's flavors would start from
            torchvision's ImageNet ResNets, which this repository cannot download).
        frozen_bn: frozen batch norm in the backbone (the paper's, with a pretrained backbone).
        trainable_stages: the backbone trains only its last this many stages (3 in the reference);
            None: all of it.
        d_model: the Transformer's width d.
        num_heads: attention heads.
        num_encoder_layers, num_decoder_layers: 6 and 6 in the paper.
        dim_feedforward: the FFNs' hidden width (2048).
        dropout: in the Transformer (0.1).
        num_queries: N, the number of object queries and predictions (100).
        aux_loss: the loss after every decoder layer, not only the last (Section 3.2).
        eos_coef: the weight of no-object in the cross-entropy (0.1).
        in_chans: input channels.
    """

    def __init__(
        self,
        num_classes: int = 91,
        backbone: str | dict = "torchvision-resnet50",
        frozen_bn: bool = True,
        trainable_stages: int | None = 3,
        d_model: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        num_queries: int = 100,
        aux_loss: bool = True,
        eos_coef: float = 0.1,
        in_chans: int = 3,
        backbone_weights: str | None = None,
    ):
        super().__init__()
        if d_model % 4:
            raise ValueError(f"d_model must be a multiple of 4 (sine and cosine pairs for rows and columns), got {d_model}")
        self.num_classes, self.in_chans, self.aux_loss = num_classes, in_chans, aux_loss
        self.backbone = Backbone(backbone, frozen_bn, trainable_stages, in_chans, backbone_weights)
        self.input_proj = nn.Conv2d(self.backbone.num_channels, d_model, kernel_size=1)  # C -> d, 1x1
        self.pos_embed = PositionEmbeddingSine(d_model // 2)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, num_heads, dim_feedforward, dropout)
                                     for _ in range(num_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, num_heads, dim_feedforward, dropout)
                                     for _ in range(num_decoder_layers))
        self.decoder_norm = nn.LayerNorm(d_model)  # shared by every decoder layer's output
        self.object_queries = nn.Embedding(num_queries, d_model)  # learned positional encodings of the outputs
        self.class_embed = nn.Linear(d_model, num_classes + 1)  # K classes and no-object
        self.bbox_embed = MLP(d_model, d_model, 4, 3)  # (cx, cy, w, h) before the sigmoid
        self.criterion = SetCriterion(num_classes, HungarianMatcher(cost_class=1, cost_bbox=5, cost_giou=2),
                                      eos_coef, weight_ce=1, weight_bbox=5, weight_giou=2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As the reference: the attention's biases zero (nn.MultiheadAttention's), then "all transformer
        weights are initialized with Xavier init" (Section 4); the rest keeps PyTorch's defaults and the
        backbone its own (He init)."""
        for layer in [*self.encoder, *self.decoder]:
            for m in layer.modules():
                if isinstance(m, MultiHeadAttention):
                    nn.init.zeros_(m.in_proj.bias)
                    nn.init.zeros_(m.out_proj.bias)
            for p in layer.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond the biases and norms: the reference decays every other weight."""
        return set()

    def encode(self, images: torch.Tensor, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder's memory (B, hw, d), the positional encodings (B, hw, d) and the valid pixels
        of the feature map (B, hw)."""
        f, mask = self.backbone(images, mask)  # (B, C, h, w)
        if mask is None:  # every pixel valid
            mask = f.new_ones(f.shape[0], f.shape[2], f.shape[3], dtype=torch.bool)
        z = rearrange(self.input_proj(f), "b d h w -> b (h w) d")  # z_0, the feature map as a sequence (B, hw, d)
        pos = rearrange(self.pos_embed(mask), "b h w d -> b (h w) d").to(z.dtype)  # (B, hw, d)
        valid = rearrange(mask, "b h w -> b (h w)")  # (B, hw), the encoder's key padding mask
        for layer in self.encoder:
            z = layer(z, pos, valid)  # (B, hw, d)
        return z, pos, valid

    def decode(self, memory: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Every decoder layer's output, normalised by the shared final LayerNorm: (L, B, N, d)."""
        query_pos = self.object_queries.weight.expand(memory.shape[0], -1, -1)  # (B, N, d)
        tgt = torch.zeros_like(query_pos)  # the decoder starts from zeros; the queries are positions
        outputs = []
        for layer in self.decoder:
            tgt = layer(tgt, query_pos, memory, pos, valid)  # (B, N, d)
            outputs.append(self.decoder_norm(tgt))
        return torch.stack(outputs)  # (L, B, N, d)

    def forward_heads(self, images: torch.Tensor, mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (L, B, N, K + 1) and boxes (L, B, N, 4), sigmoid (cx, cy, w, h) normalised by
        each image's own size, after every decoder layer."""
        hs = self.decode(*self.encode(images, mask))  # (L, B, N, d)
        return self.class_embed(hs), self.bbox_embed(hs).sigmoid()

    def detect(self, images: torch.Tensor, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The last layer's N detections per image as fixed-shape tensors (what ONNX export takes):
        boxes (B, N, 4) x1 y1 x2 y2 in each image's pixels, clipped to it; scores (B, N), the largest
        class probability with no-object left out of the choice; labels (B, N). Every query is kept:
        no threshold and no non-maximum suppression, as the reference's PostProcess."""
        logits, boxes = self.forward_heads(images, mask)
        prob = logits[-1].softmax(-1)[..., :-1]  # (B, N, K): no-object dropped after the softmax
        scores, labels = prob.max(-1)  # (B, N)
        boxes = clip_boxes_to_image(box_convert(boxes[-1], "cxcywh", "xyxy"), (1, 1))  # normalised, in the image
        h, w = image_sizes(images, mask).to(boxes.dtype).unbind(-1)  # (B,), (B,)
        return boxes * torch.stack([w, h, w, h], dim=-1)[:, None, :], scores, labels  # pixels, (B, N, 4)

    def losses(self, images: torch.Tensor, mask: torch.Tensor | None, targets: list[dict]) -> dict[str, torch.Tensor]:
        """The Hungarian loss terms (loss.py) in whichever mode the model is in (forward takes them in
        training; in eval mode they are a validation loss without dropout)."""
        logits, boxes = self.forward_heads(images, mask)  # (L, B, N, K + 1), (L, B, N, 4)
        if not self.aux_loss:
            logits, boxes = logits[-1:], boxes[-1:]
        return self.criterion(logits, boxes, targets, image_sizes(images, mask))

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None, targets: list[dict] | None = None):
        """Training with targets: the weighted loss terms {"loss_ce", "loss_bbox", "loss_giou"}, each
        summed over the decoder layers (the last only without aux_loss). Otherwise: B dicts
        {"boxes" (N, 4), "scores" (N,), "labels" (N,)}, see `detect`.

        Args:
            images: (B, C, H, W), zero-padded outside mask.
            mask: (B, H, W), True on each image's valid pixels (a top-left rectangle); None: all valid.
            targets: B dicts {"boxes": (n_i, 4) x1 y1 x2 y2 in pixels, "labels": (n_i,)}.
        """
        if self.training and targets is not None:
            return self.losses(images, mask, targets)
        boxes, scores, labels = self.detect(images, mask)
        return [{"boxes": b, "scores": s, "labels": l} for b, s, l in zip(boxes, scores, labels)]


# Section 4 and Table 1: ResNet-50 and -101 from torchvision (the stride on the 3x3 of the
# bottleneck), frozen batch norm, layer1 and the stem frozen; 6 + 6 layers, d = 256, 8 heads, FFN
# 2048, dropout 0.1, 100 queries; 91 classes (COCO's ids). DC5 (a dilated last stage) is not built:
# papers/resnet has no dilation.
PAPER = dict(frozen_bn=True, trainable_stages=3, d_model=256, num_heads=8, num_encoder_layers=6,
             num_decoder_layers=6, dim_feedforward=2048, dropout=0.1, num_queries=100, num_classes=91)

# tiny: the repo's own for digits-detect (48-128 px canvases, 8-32 px digits, at most 6 of them): a
# two-stage basic-block ResNet with the ImageNet stem, stride 8 (an 8 px digit is one position, a
# 128 px side 16), pretrained to classify the digits (pretrain.py) as the paper's is on ImageNet, its
# batch norm frozen as the paper's; d = 128, 4 heads, FFN 256, 2 + 2 layers, 20 queries; no dropout
# (on a CPU, dropping attention weights costs a third of a step).
FLAVORS = {
    "tiny": dict(backbone=dict(block="basic", layers=(1, 1), widths=(32, 64), stem="imagenet"),
                 backbone_weights="tiny_backbone.safetensors", frozen_bn=True, trainable_stages=None, d_model=128,
                 num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=256, dropout=0.0,
                 num_queries=20, num_classes=10),
}
# tiny-scratch: tiny with its backbone trained from scratch (He init, batch norm that trains): what the
# pretraining buys (README, "Our results").
FLAVORS["tiny-scratch"] = {**FLAVORS["tiny"], "backbone_weights": None, "frozen_bn": False}
FLAVORS |= {
    "DETR": dict(backbone="torchvision-resnet50", **PAPER),
    "DETR-R101": dict(backbone="torchvision-resnet101", **PAPER),
}
