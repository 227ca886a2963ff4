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


# Variable sizes: a padded batch (B, C, H_max, W_max) with a mask (B, H_max, W_max), True on each
# sample's top-left h_i x w_i rectangle. Trained on 24x24 (a 6x6 grid of 4x4 patches), so every
# other size interpolates E_pos.
VARIABLE = (24, 4, 3, 7, 32, 2, 4, 2.0)


def pad(images):
    """Zero-pad images of different sizes into one batch, and the mask of their valid pixels."""
    H, W = max(x.shape[1] for x in images), max(x.shape[2] for x in images)
    batch = torch.zeros(len(images), images[0].shape[0], H, W)
    mask = torch.zeros(len(images), H, W, dtype=torch.bool)
    for i, x in enumerate(images):
        batch[i, :, :x.shape[1], :x.shape[2]] = x
        mask[i, :x.shape[1], :x.shape[2]] = True
    return batch, mask


@pytest.mark.parametrize("sizes", [
    [(16, 24), (32, 32), (20, 12), (28, 16)],  # none at the trained 24x24
    [(16, 24), (24, 24), (20, 12), (24, 24), (12, 32)],  # two at the trained size, two sharing a grid
], ids=["all-interpolated", "with-trained-size"])
def test_padded_batch_gives_each_sample_its_own_logits(sizes):
    model = from_timm(random_timm_vit(*VARIABLE)).eval()
    torch.manual_seed(1)
    images = [torch.randn(3, h, w) for h, w in sizes]
    batch, mask = pad(images)
    with torch.no_grad():
        batched = model(batch, mask)
        alone = torch.cat([model(x[None]) for x in images])  # unpadded, mask=None, each at its own size
        noisy = model(torch.where(mask[:, None], batch, torch.randn_like(batch)), mask)  # padding not zero
    assert batched.shape == (len(sizes), VARIABLE[3])
    assert (batched - alone).abs().max() < 1e-5
    assert (noisy - alone).abs().max() < 1e-5  # padded patches are never attended to
    assert (alone[0] - alone[1]).abs().max() > 1e-2  # the samples differ: the check could fail


def test_all_true_mask_is_no_mask_and_the_trained_size_is_timm():
    theirs = random_timm_vit(*VARIABLE)
    ours = from_timm(theirs).eval()
    x = torch.randn(2, 3, 24, 24)
    with torch.no_grad():
        assert torch.equal(ours(x, torch.ones(2, 24, 24, dtype=torch.bool)), ours(x))
        assert (ours(x) - theirs(x)).abs().max() < 1e-5


def test_non_square_sizes_match_timm():
    """A ViT trained on 16x24 images: timm at that size, and timm's own resampling at another size.

    timm's dynamic_img_size=True resamples E_pos with `resample_abs_pos_embed`'s default
    antialias=True, which for bicubic uses another kernel (PIL's, a = -0.5, against a = -0.75)
    even when enlarging, so it is only the same computation on the trained grid. At another
    size, compare with a timm model built for it holding E_pos resampled by timm's function
    with antialias=False, the interpolation we use.
    """
    from timm.layers import resample_abs_pos_embed

    config = ((16, 24), 4, 3, 7, 32, 2, 4, 2.0)
    theirs = random_timm_vit(*config)
    ours = from_timm(theirs).eval()
    dynamic = timm.models.VisionTransformer(img_size=(16, 24), patch_size=4, num_classes=7, embed_dim=32,
                                            depth=2, num_heads=4, mlp_ratio=2.0, dynamic_img_size=True)
    dynamic.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert (ours(x) - dynamic.eval()(x)).abs().max() < 1e-5

    for size in [(28, 12), (8, 40)]:
        resized = timm.models.VisionTransformer(img_size=size, patch_size=4, num_classes=7, embed_dim=32,
                                                depth=2, num_heads=4, mlp_ratio=2.0)
        state = theirs.state_dict()
        state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=[s // 4 for s in size],
                                                    old_size=[4, 6], antialias=False)
        resized.load_state_dict(state)
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert (ours(x) - resized.eval()(x)).abs().max() < 1e-5


def test_sizes_that_do_not_divide_into_patches_are_refused():
    model = from_timm(random_timm_vit(*VARIABLE))
    with pytest.raises(ValueError, match="image size 18x24 is not a multiple of the patch size 4"):
        model(torch.zeros(1, 3, 18, 24))
    batch, mask = pad([torch.randn(3, 18, 24), torch.randn(3, 24, 8)])  # padded to 24x24, but 18 rows valid
    with pytest.raises(ValueError, match="sample 0 has 18x24 valid pixels, not a .* multiple of the patch size 4"):
        model(batch, mask)
    mask[1, 0, 20] = True  # not a rectangle any more
    with pytest.raises(ValueError, match="top-left"):
        model(batch, mask)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        model(batch, mask.float())


def test_padded_batch_trains():
    model = from_timm(random_timm_vit(*VARIABLE)).train()
    batch, mask = pad([torch.randn(3, 16, 24), torch.randn(3, 32, 8)])
    model(batch, mask).logsumexp(dim=1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.E_pos.grad[0, 1:].abs().sum(dim=1).gt(0).all()  # every learned position gets a gradient
