"""U-Net's elastic deformation (Section 3.1), `--augment elastic:10` on a segmentation data set: the field
of 3x3 displacement vectors of 10 pixels std, interpolated bicubically, on torchvision's warp. The code is in
common/data/elastic.py, with every segmentation paper's data path."""

from common.data.elastic import ElasticDeformation, Warped

__all__ = ["ElasticDeformation", "Warped"]
