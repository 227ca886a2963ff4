"""Swin Transformer against torchvision's and timm's SwinTransformer, against Figure 4's mask, and against Table 1."""

import pytest
import timm
import torch
import torch.nn as nn
import torchvision
from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformerBlockV2

from common.flags import parse_model_kwargs
from common.throughput import forward_macs
from papers import get_paper
from papers.swin import from_timm, from_torchvision
from papers.swin import model as swin_model
from papers.swin.model import SwinTransformerBlock, shifted_window_mask

PAPER = get_paper("swin")

CONFIGS = [  # (patch, C, depths, heads, window, classes, mlp_ratio, image H x W)
    (4, 32, (2, 2, 2), (2, 4, 8), 4, 7, 4.0, (40, 52)),  # 10x13 patches: padded to whole windows in every block
    (2, 24, (1, 3), (3, 6), 3, 5, 2.0, (26, 30)),  # odd map sides: patch merging pads them too
    (4, 48, (2, 2), (2, 4), 7, 10, 4.0, (56, 56)),  # M = 7: 2x2 windows, then one window, not shifted
    (4, 16, (2, 2, 4, 2), (1, 2, 4, 8), 3, 1000, 4.0, (64, 48)),  # four stages, swin_t's depths and classes
]


def random_torchvision(patch, dim, depths, heads, window, classes, mlp_ratio, size=None, **kwargs) -> nn.Module:
    """A torchvision SwinTransformer in eval mode with random weights everywhere (unit norms, zero biases
    or a zero table would hide a tensor mapped to the wrong place)."""
    torch.manual_seed(0)
    model = torchvision.models.SwinTransformer(patch_size=[patch, patch], embed_dim=dim, depths=list(depths),
                                               num_heads=list(heads), window_size=[window, window],
                                               mlp_ratio=mlp_ratio, num_classes=classes, **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("config", CONFIGS, ids=[f"p{c[0]}-C{c[1]}-d{len(c[2])}-M{c[4]}-{c[7][0]}x{c[7][1]}"
                                                 for c in CONFIGS])
def test_logits_equal_torchvision(config):
    theirs = random_torchvision(*config)
    ours = from_torchvision(theirs).eval()
    torch.manual_seed(1)
    x = torch.randn(2, 3, *config[7])
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.shape == (2, config[5])
    assert (got - expected).abs().max() < 1e-5
    assert (expected[0] - expected[1]).abs().max() > 1e-2  # the outputs depend on the input: the check can fail


def test_from_torchvision_keeps_the_stochastic_depth_and_dropout():
    theirs = random_torchvision(*CONFIGS[1][:7], stochastic_depth_prob=0.3, dropout=0.1)
    ours = from_torchvision(theirs)
    rates = [b.drop_path for b in ours.blocks if isinstance(b, SwinTransformerBlock)]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])  # torchvision's: linear from 0 to the rate
    assert ours.blocks[0].attn.dropout.p == 0.1


@pytest.mark.parametrize("kwargs, match", [
    (dict(block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2), "V2"),
    (dict(attention_dropout=0.1), "attention dropout"),
])
def test_from_torchvision_refuses_what_the_paper_has_not(kwargs, match):
    theirs = random_torchvision(*CONFIGS[1][:7], **kwargs)
    with pytest.raises(ValueError, match=match):
        from_torchvision(theirs)


def test_from_torchvision_refuses_non_square_windows():
    theirs = torchvision.models.SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2], num_heads=[2],
                                                window_size=[3, 4], num_classes=3)
    with pytest.raises(ValueError, match="non-square window"):
        from_torchvision(theirs)


TIMM_CONFIGS = [  # timm's constructor; image sizes at which every stage's map is a multiple of the window
    dict(img_size=56, patch_size=4, window_size=7, embed_dim=32, depths=(2, 2), num_heads=(2, 4), num_classes=5),
    dict(img_size=64, patch_size=2, window_size=4, embed_dim=24, depths=(1, 2, 2), num_heads=(3, 6, 12),
         num_classes=7, in_chans=1, mlp_ratio=2.0),
    dict(img_size=96, patch_size=4, window_size=3, embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
         num_classes=1000),
]


def random_timm(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = timm.models.SwinTransformer(**kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("config", TIMM_CONFIGS, ids=[f"img{c['img_size']}-M{c['window_size']}" for c in TIMM_CONFIGS])
def test_logits_equal_timm(config):
    theirs = random_timm(**config)
    ours = from_timm(theirs).eval()
    torch.manual_seed(1)
    x = torch.randn(2, config.get("in_chans", 3), config["img_size"], config["img_size"])
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.shape == (2, config["num_classes"])
    assert (got - expected).abs().max() < 1e-5
    assert (expected[0] - expected[1]).abs().max() > 1e-3


def test_from_timm_maps_swin_tiny_patch4_window7_224():
    with torch.device("meta"):
        ours = from_timm(timm.create_model("swin_tiny_patch4_window7_224"))
    assert sum(p.numel() for p in ours.parameters()) == 28_288_354 and ours.window_size == 7


@pytest.mark.parametrize("kwargs, match", [
    (dict(img_size=48), "timm shrinks a window"),  # stage 2's 6x6 map: timm's window becomes 6, ours stays 7
    (dict(global_pool="max"), "pooling"),
    (dict(attn_drop_rate=0.1), "attention dropout"),
    (dict(qkv_bias=False), "does not map"),
    (dict(head_dim=8), "head_dim"),
])
def test_from_timm_refuses_what_it_cannot_map(kwargs, match):
    theirs = timm.models.SwinTransformer(**{**TIMM_CONFIGS[0], **kwargs})
    with pytest.raises(ValueError, match=match):
        from_timm(theirs)


def naive_window(position: int, M: int, shift: int) -> int:
    """Figure 2 (right): the shifted partition without the cyclic shift, windows displaced by `shift`
    from the regular ones; the index along one side of the window holding this row (or column)."""
    return (position - shift) // M


def test_shifted_window_mask_is_figure_4():
    """After the cyclic shift, two tokens of one window may attend to each other exactly when they lie
    in one window of the shifted partition before the shift (Figure 2 right): tokens that the shift
    brought together from different sub-windows cannot."""
    H, W, M, s = 12, 8, 4, 2
    mask = shifted_window_mask(H, W, M, (s, s))  # (nW, M*M, M*M)
    assert mask.shape == ((H // M) * (W // M), M * M, M * M)
    for w in range(mask.shape[0]):
        top, left = (w // (W // M)) * M, (w % (W // M)) * M
        # each token's place in the map before the cyclic shift toward the top-left by s
        rows = [(top + i // M + s) % H for i in range(M * M)]
        cols = [(left + i % M + s) % W for i in range(M * M)]
        window_of = [(naive_window(r, M, s), naive_window(c, M, s)) for r, c in zip(rows, cols)]
        expected = torch.tensor([[a == b for b in window_of] for a in window_of])
        assert torch.equal(mask[w], expected)
    assert mask[0].all() and not mask[-1].all()  # a window far from the wrap is whole; the corner's is cut in 4
    assert len({tuple(row.tolist()) for row in mask[-1]}) == 4


def test_shifted_block_keeps_the_regions_apart():
    """In SW-MSA, the map's top-left token reaches the bottom-right window through the cyclic shift, but
    changes nothing there; the same block with its mask taken away lets it."""
    torch.manual_seed(0)
    block = SwinTransformerBlock(dim=16, num_heads=2, M=4, shifted=True).eval()
    x = torch.randn(1, 8, 8, 16)
    x2 = x.clone()
    x2[0, 0, 0] += 1.0  # the top-left token; after the shift by 2 it sits in the bottom-right window
    with torch.no_grad():
        same = (block.window_msa(x2) - block.window_msa(x)).abs()[0]  # (H, W, C)
    assert same[7, 7].max() == 0 and same[6, 6].max() == 0  # the bottom-right window's own region
    assert same[1, 1].max() > 0  # a token of the top-left token's own sub-window
    original = swin_model.shifted_window_mask
    try:
        swin_model.shifted_window_mask = lambda *args: torch.ones_like(original(*args))
        with torch.no_grad():
            unmasked = (block.window_msa(x2) - block.window_msa(x)).abs()[0]
    finally:
        swin_model.shifted_window_mask = original
    assert unmasked[7, 7].max() > 0


def attention_masks(model: nn.Module, x: torch.Tensor) -> list:
    """The mask each block's attention is called with (None: W-MSA, or no shift)."""
    seen = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
             for b in model.blocks if isinstance(b, SwinTransformerBlock)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def test_shift_switch_changes_only_the_shift():
    """Table 4's "w/o shifting": --model-kwargs shift=false, the same parameters, W-MSA in every block."""
    torch.manual_seed(0)
    shifted = PAPER.build("tiny").eval()
    plain = PAPER.build("tiny", shift=False).eval()
    assert [(k, v.shape) for k, v in shifted.state_dict().items()] == [(k, v.shape) for k, v in plain.state_dict().items()]
    with torch.no_grad():  # weights larger than the initialisation's, so that the windows' difference shows
        for name, p in shifted.named_parameters():
            p.normal_(1.0 if ".norm" in name and name.endswith("weight") else 0.0, 0.2)
    plain.load_state_dict(shifted.state_dict())
    x = torch.randn(2, 1, 28, 28)
    masks = attention_masks(shifted, x)
    assert [m is not None for m in masks] == [False, True, False, False]  # stage 2's 7x7 map is one window
    assert all(m is None for m in attention_masks(plain, x))
    with torch.no_grad():  # the features of every token, before the pooling averages them
        assert (shifted.forward_features(x) - plain.forward_features(x)).abs().max() > 0.05


def test_the_switch_as_the_command_line_gives_it():
    model = PAPER.build_for_data("tiny", dict(num_classes=10, in_chans=1), parse_model_kwargs(["shift=false"]))
    assert not any(b.shift for b in model.blocks if isinstance(b, SwinTransformerBlock))
    assert [b.shift for b in PAPER.build("tiny").blocks if isinstance(b, SwinTransformerBlock)] == [0, 3, 0, 3]
    with pytest.raises(ValueError, match="shift must be True or False"):
        PAPER.build("tiny", shift="no")


def test_image_size_must_divide_into_patches():
    with pytest.raises(ValueError, match="not a multiple of the patch size 2"):
        PAPER.build("tiny")(torch.zeros(1, 1, 27, 28))


TABLE1 = {"swin_t": 28, "swin_s": 50, "swin_b": 88}  # millions of parameters


@pytest.mark.parametrize("flavor", TABLE1)
def test_table1_parameters(flavor):
    """Table 1 at 224x224, 1000 classes: parameters within 2% of the printed millions."""
    with torch.device("meta"):
        count = sum(p.numel() for p in PAPER.build(flavor).parameters())
    assert abs(count / (TABLE1[flavor] * 1e6) - 1) < 0.02, count


def test_table1_swin_t_flops():
    """Swin-T's 4.5G FLOPs at 224x224 (Table 1), multiply-adds counted on the meta device (the linear
    layers and the attention's two products), within 2%; torchvision's swin_t has the same count."""
    macs = forward_macs(lambda: PAPER.build("swin_t"), 3, 224, 224)
    assert abs(macs / 4.5e9 - 1) < 0.02, macs
    assert macs == forward_macs(lambda: torchvision.models.swin_t(), 3, 224, 224)


def test_swin_t_has_torchvision_swin_t_tensors():
    with torch.device("meta"):
        ours, theirs = PAPER.build("swin_t"), torchvision.models.swin_t()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()) == 28_288_354


def test_swin_l_parameters():
    """Table 1(b)'s Swin-L, 197M (at 384x384 with M = 12; our flavor's M = 7 has smaller bias tables)."""
    with torch.device("meta"):
        count = sum(p.numel() for p in PAPER.build("swin_l").parameters())
    assert abs(count / 197e6 - 1) < 0.01, count
