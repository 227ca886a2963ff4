"""U-Net: Ronneberger, Fischer and Brox, "U-Net: Convolutional Networks for Biomedical Image Segmentation",
MICCAI 2015.

The model (model.py), the overlap-tile strategy (tiling.py), the weight map of equation 2 (weights.py) and
the elastic deformation (augment.py). Not registered yet: the segmentation task and its data set come first,
then a PAPER spec and the folder's line in papers/__init__.py."""
