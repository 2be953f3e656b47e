"""cosmos-pl: model-agnostic personalized federated learning (COSMOS) on PyTorch Lightning."""

__version__ = "0.1.0"
