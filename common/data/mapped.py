"""A data set whose samples pass through a function of the whole sample (common.data.PixelWeights,
common.data.elastic.Warped)."""

from torch.utils.data import Dataset


class Mapped(Dataset):
    """A data set whose samples pass through `self.map(image, target)` each time they are read (a training
    set's augmentation of whole samples, its targets' extra maps); keeps `sizes` for bucketing."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        if hasattr(dataset, "sizes"):
            self.sizes = dataset.sizes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        return self.map(*self.dataset[i])

    def map(self, image, target):
        raise NotImplementedError
