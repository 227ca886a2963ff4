"""ViT against timm's VisionTransformer, and against the paper's Table 1."""

import pytest
import timm
import torch

from papers import get_paper
from papers.vit import from_timm

CONFIGS = [  # (img_size, patch_size, in_chans, num_classes, dim, depth, num_heads, mlp_ratio)
    (8, 2, 1, 10, 32, 2, 4, 2.0),
    (32, 4, 3, 100, 48, 3, 3, 4.0),
    (28, 7, 2, 5, 64, 1, 8, 1.5),
    (48, 16, 3, 1000, 96, 2, 2, 4.0),
]


def random_timm_vit(img_size, patch_size, in_chans, num_classes, dim, depth, num_heads, mlp_ratio):
    torch.manual_seed(0)
    model = timm.models.VisionTransformer(
        img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
        embed_dim=dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, class_token=True,
        global_pool="token", qkv_bias=True,
    )
    with torch.no_grad():  # random everywhere: a zero head or unit norms would hide mistakes
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("config", CONFIGS, ids=[f"img{c[0]}-p{c[1]}-c{c[2]}-d{c[4]}x{c[5]}-h{c[6]}" for c in CONFIGS])
def test_logits_equal_timm(config):
    theirs = random_timm_vit(*config)
    ours = from_timm(theirs).eval()
    x = torch.randn(4, config[2], config[0], config[0])
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.shape == (4, config[3])
    assert (got - expected).abs().max() < 1e-5


def test_from_timm_rejects_parts_the_paper_has_not():
    theirs = timm.models.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2,
                                           num_classes=3, global_pool="avg")
    with pytest.raises(ValueError, match="parts the paper's ViT has not"):
        from_timm(theirs)


@pytest.mark.parametrize("flavor, millions", [("ViT-B/16", 86), ("ViT-L/16", 307), ("ViT-H/14", 632)])
def test_table1_parameter_counts(flavor, millions):
    with torch.device("meta"):
        model = get_paper("vit").build(flavor)  # 224x224 images, 1000 classes
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / (millions * 1e6) - 1) < 0.015, count


def test_table1_flavors_match_timm_parameter_counts():
    for flavor, name in [("ViT-B/16", "vit_base_patch16_224"), ("ViT-L/16", "vit_large_patch16_224")]:
        with torch.device("meta"):
            ours = get_paper("vit").build(flavor)
            theirs = timm.create_model(name, pretrained=False)
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_image_size_must_divide_into_patches():
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        get_paper("vit").build("ViT-B/16", img_size=8)
