"""FCN: Long, Shelhamer and Darrell, "Fully Convolutional Networks for Semantic Segmentation", CVPR 2015.

The model only (model.py; torchvision's weights: spec.py). Not registered yet: the segmentation task and
its data set come first, then a PAPER spec in spec.py and the folder's line in papers/__init__.py."""
