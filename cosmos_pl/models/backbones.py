"""Backbone factory for COSMOS clients and teachers.

COSMOS is model-agnostic: every client (and the server-side teachers) may use a
different architecture. The paper's experiments (Section 6, model families listed
in Appendix C) use ResNet, VGG, MobileNet, EfficientNet-style, AlexNet and
SqueezeNet backbones trained from scratch with Kaiming initialisation. This module
builds all of them behind a single function, :func:`create_backbone`:

* any `timm <https://github.com/huggingface/pytorch-image-models>`_ architecture,
  created with ``pretrained=False`` (no weights are ever downloaded or loaded: a
  name with a pretrained tag, ``resnet18.a1_in1k``, is refused);
* torchvision's ``alexnet``, ``squeezenet1_0`` and ``squeezenet1_1`` (which timm
  lacks), created with ``weights=None``.

Every backbone maps a float image batch ``[B, in_chans, H, W]`` to logits
``[B, num_classes]``. For small inputs (``image_size <= 64``: 8x8 scikit-learn
digits, 28x28 (Fashion-)MNIST, 32x32 CIFAR, 64x64 Tiny-ImageNet) the ImageNet stems
are adapted as is customary for CIFAR, see :func:`create_backbone`.

Names are checked as soon as the settings are read (:func:`check_backbone_name`), and every backbone is tried
on the data's input shape before round 0 (:func:`check_backbones`), so a backbone that cannot take the images
fails before any client trains.
"""

from __future__ import annotations

import difflib
import functools
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from cosmos_pl.errors import ConfigError

__all__ = [
    "BACKBONE_REVISION",
    "TORCHVISION_BACKBONES",
    "SMALL_INPUT_MAX_SIZE",
    "available_backbones",
    "create_backbone",
    "check_backbone_name",
    "check_backbones",
    "kaiming_init_",
    "count_parameters",
]

#: Backbones taken from ``torchvision.models`` because timm does not provide them.
TORCHVISION_BACKBONES: tuple[str, ...] = ("alexnet", "squeezenet1_0", "squeezenet1_1")

#: Bumped whenever a backbone's definition changes, so that saved round-0 models (``--round0_cache``) of an
#: older definition are never loaded into a newer one. 2: SqueezeNet without the ReLU on its logits.
BACKBONE_REVISION = 2

#: Inputs with ``image_size <= SMALL_INPUT_MAX_SIZE`` get CIFAR-style stems.
SMALL_INPUT_MAX_SIZE = 64

#: MobileNet/EfficientNet-style ``conv_stem`` strides are set to 1 up to this size.
_CONV_STEM_STRIDE1_MAX_SIZE = 32


# ---------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------
_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def kaiming_init_(module: nn.Module) -> nn.Module:
    """Re-initialise ``module`` in place with Kaiming (He) initialisation.

    Source: COSMOS paper, Appendix C (all backbones are trained from scratch with
    Kaiming initialisation); He et al., "Delving Deep into Rectifiers", ICCV 2015.

    For every submodule:

    * ``nn.Conv*d`` / ``nn.ConvTranspose*d`` and ``nn.Linear`` weights:
      ``kaiming_normal_(mode="fan_in", nonlinearity="relu")``, i.e. a zero-mean
      normal with ``std = sqrt(2 / fan_in)`` where ``fan_in = in_channels / groups
      * kH * kW`` for convolutions and ``in_features`` for linear layers. Their
      biases (if any) are set to 0.
    * BatchNorm (and GroupNorm / LayerNorm with affine parameters): weight 1, bias 0.
      This deliberately overrides timm's zero-init of the last BN in residual blocks.

    ``fan_in`` (rather than ``fan_out``) is used because it preserves the variance of
    the forward signal (He et al., Eq. 10), takes grouped/depthwise convolutions into
    account (PyTorch's ``fan_out`` ignores ``groups`` and would make depthwise kernels
    ~``sqrt(C)`` times too small), and keeps the scale of narrow classifier heads
    (e.g. ``Linear(512, 10)``) moderate.

    Parameters that belong to none of these layer types (e.g. ViT position
    embeddings) keep the initialisation of their architecture.

    Args:
        module: Any ``nn.Module``; modified in place.

    Returns:
        The same ``module``, for chaining.
    """
    for m in module.modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, _NORM_TYPES):
            if getattr(m, "weight", None) is not None:
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    return module


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------
def _names_cache() -> Path:
    """Where timm's architecture names are kept for this timm version (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    try:
        timm_version = version("timm")
    except PackageNotFoundError:
        timm_version = "unknown"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cosmos-pl" / f"timm-{timm_version}-architectures.txt"


@functools.lru_cache(maxsize=1)
def _timm_architectures() -> frozenset[str]:
    """timm's registered architecture names, read from a per-version cache file so that checking a name in the
    settings does not import timm (about a second of start-up); the first call of a timm version imports timm and
    writes the file (atomically; skipped where the cache folder cannot be written)."""
    path = _names_cache()
    try:
        names = path.read_text().split()
        if names:
            return frozenset(names)
    except OSError:
        pass
    import timm

    names = sorted(timm.list_models())
    try:
        from cosmos_pl.files import atomic_write_text

        atomic_write_text(path, "\n".join(names) + "\n")
    except Exception:  # a read-only home: the names are still right, only slower next time
        pass
    return frozenset(names)


def available_backbones() -> list[str]:
    """Names accepted by :func:`create_backbone`.

    Returns:
        ``timm.list_models()`` (all timm architectures, without pretrained tags,
        sorted) followed by :data:`TORCHVISION_BACKBONES`.
    """
    return sorted(_timm_architectures()) + list(TORCHVISION_BACKBONES)


def _is_backbone(name: object) -> bool:
    """Whether ``name`` names an architecture :func:`create_backbone` knows (as ``timm.is_model``: a pretrained
    tag after '.' is not looked at; :func:`_pretrained_tag` finds it)."""
    return name in TORCHVISION_BACKBONES or (isinstance(name, str) and name.split(".", 1)[0] in _timm_architectures())


def _pretrained_tag(name: object) -> str | None:
    """The pretrained tag of a timm name (``"a1_in1k"`` of ``"resnet18.a1_in1k"``), or None."""
    if not isinstance(name, str) or name in TORCHVISION_BACKBONES or "." not in name:
        return None
    return name.split(".", 1)[1]


def _pretrained_tag_error(name: str, key: str) -> ConfigError:
    arch, tag = name.split(".", 1)
    return ConfigError(f"{key}={name!r}: '.{tag}' is a timm pretrained tag, but cosmos-pl loads no pretrained "
                       f"weights (every backbone trains from scratch with Kaiming initialisation, as in the COSMOS "
                       f"paper); give the architecture alone: {arch!r}")


def _unknown_backbone_hint(name: str) -> str:
    close = difflib.get_close_matches(name, available_backbones(), n=5)
    hint = f" Did you mean one of: {', '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"{hint} List timm architectures with "
        f"timm.list_models('*pattern*') (e.g. timm.list_models('*resnet*')), or all "
        f"accepted names with cosmos_pl.models.available_backbones(); torchvision "
        f"backbones: {', '.join(TORCHVISION_BACKBONES)}."
    )


def _unknown_backbone_error(name: str) -> ConfigError:
    return ConfigError(f"Unknown backbone {name!r}.{_unknown_backbone_hint(name)}")


def check_backbone_name(name: str, key: str) -> None:
    """Check, from the settings alone (before any data is loaded), that ``name`` is a backbone
    :func:`create_backbone` can build.

    Args:
        name: the architecture name given in the settings.
        key: its dotted setting key, e.g. ``"clients.backbones[1]"`` or ``"algorithm.init_args.teacher_backbone"``.

    Raises:
        ConfigError: ``"{key}='resnet18x': unknown backbone. Did you mean one of: 'resnet18', ...?"`` (up to 5
            close names from ``timm.list_models()`` and torchvision's, by ``difflib``) and how to list them; or a
            name with a timm pretrained tag (``resnet18.a1_in1k``): no pretrained weights are loaded, so the tag
            would be ignored (the message names the architecture to give instead).
    """
    if not _is_backbone(name):
        raise ConfigError(f"{key}={name!r}: unknown backbone.{_unknown_backbone_hint(str(name))}")
    if _pretrained_tag(name) is not None:
        raise _pretrained_tag_error(name, key)


def check_backbones(backbones: dict[str, str], num_classes: int, input_shape: tuple[int, int, int]) -> None:
    """Dry-run every backbone on the data before training: each distinct name is built once on the CPU (as
    :func:`create_backbone` builds it for this data) and fed a batch of 2 blank images ``[2, C, H, W]`` in
    evaluation mode without gradients; it must return logits ``[2, M]``. The global random state is left as it
    was, so a run's numbers do not change.

    Args:
        backbones: dotted setting key -> architecture name, e.g. ``{"clients.backbones[0]": "resnet18",
            "algorithm.init_args.teacher_backbone": "vgg16"}``.
        num_classes: M.
        input_shape: the images' ``(C, H, W)``.

    Raises:
        ConfigError: an unknown name (see :func:`check_backbone_name`), or backbones that cannot be built for
            these inputs, fail on them, or return another shape; one line naming every failing key, its name,
            the input shape, the underlying error's first line, and the fix.
    """
    for key, name in backbones.items():
        check_backbone_name(name, key)
    c, h, w = input_shape
    keys_of: dict[str, list[str]] = {}
    for key, name in backbones.items():
        keys_of.setdefault(name, []).append(key)
    failures = []
    with torch.random.fork_rng(devices=[]):
        for name, keys in keys_of.items():
            problem = _dry_run(name, num_classes, (c, h, w))
            if problem:
                failures.append(f"{' and '.join(keys)}={name!r} cannot take this data's images of shape "
                                f"(C, H, W) = ({c}, {h}, {w}) with M = {num_classes} classes: {problem}")
    if failures:
        raise ConfigError("; ".join(failures) + ". Choose another backbone (small-input stems: timm ResNets, VGGs, "
                          "MobileNet/EfficientNet/LCNet-style models, torchvision alexnet and squeezenet; see "
                          "cosmos_pl.models.create_backbone), or use larger images (cosmos_pl.data.ImageFolderData "
                          "resizes to its image_size)")


def _dry_run(name: str, num_classes: int, input_shape: tuple[int, int, int]) -> str | None:
    """None if backbone ``name`` maps ``[2, C, H, W]`` zeros to ``[2, M]`` logits, else what went wrong."""
    c, h, w = input_shape
    try:
        model = create_backbone(name, num_classes, c, max(h, w)).eval()
        with torch.no_grad():
            out = model(torch.zeros(2, c, h, w))
    except Exception as err:  # any failure here is the backbone's with these inputs, reported with its message
        lines = str(err).strip().splitlines()
        message = lines[0][:300].rstrip(". ") if lines else ""
        return f"{type(err).__name__}: {message}" if message else type(err).__name__
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    return None if shape == (2, num_classes) else f"it returns {shape} instead of logits (2, {num_classes})"


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def _first_conv(module: nn.Module) -> nn.Conv2d | None:
    if isinstance(module, nn.Conv2d):
        return module
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            return m
    return None


def _conv_like(conv: nn.Conv2d, in_channels: int, **overrides) -> nn.Conv2d:
    """A fresh ``nn.Conv2d`` with ``conv``'s geometry, new in_channels and overrides."""
    kwargs = dict(
        out_channels=conv.out_channels,
        kernel_size=conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
    )
    kwargs.update(overrides)
    return nn.Conv2d(in_channels, **kwargs)


# ---------------------------------------------------------------------------
# torchvision backbones
# ---------------------------------------------------------------------------
def _cifar_alexnet(num_classes: int, in_chans: int) -> nn.Module:
    """AlexNet for small inputs (CIFAR form), as a ``torchvision.models.AlexNet``.

    Keeps AlexNet's 5-conv 64-192-384-256-256 ReLU stack but with 3x3 stride-1
    convolutions (padding 1) and three 2x2 max-pools (32 -> 16 -> 8 -> 4; 28 -> 3;
    8 -> 1), then ``AdaptiveAvgPool2d(2)`` and a modest classifier
    ``Dropout(0.5), Linear(1024, 1024), ReLU, Dropout(0.5), Linear(1024, 1024), ReLU,
    Linear(1024, num_classes)``: ~4.4M parameters instead of ImageNet AlexNet's 61M.
    """
    import torchvision  # here, not at import: the CLI checks settings without it

    model = torchvision.models.alexnet(weights=None, num_classes=num_classes)
    model.features = nn.Sequential(
        nn.Conv2d(in_chans, 64, kernel_size=3, stride=1, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=2, stride=2),
        nn.Conv2d(64, 192, kernel_size=3, stride=1, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=2, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, stride=1, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, stride=1, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, kernel_size=3, stride=1, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=2, stride=2),
    )
    model.avgpool = nn.AdaptiveAvgPool2d((2, 2))
    hidden = 1024
    model.classifier = nn.Sequential(
        nn.Dropout(p=0.5),
        nn.Linear(256 * 2 * 2, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(p=0.5),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, num_classes),
    )
    return model


def _create_torchvision(name: str, num_classes: int, in_chans: int, *, small: bool) -> nn.Module:
    import torchvision  # here, not at import: the CLI checks settings without it

    if name == "alexnet":
        if small:
            return _cifar_alexnet(num_classes, in_chans)
        model = torchvision.models.alexnet(weights=None, num_classes=num_classes)
        if in_chans != 3:
            model.features[0] = _conv_like(model.features[0], in_chans)
        return model

    # SqueezeNet 1.0 / 1.1: torchvision's head is Dropout, Conv2d(512, num_classes, 1), ReLU, AdaptiveAvgPool2d(1).
    # The ReLU clamps logits at 0: a client that sees only its class group pushes the other classes' maps below
    # 0, where they get no gradient ever again, so distillation cannot teach it those classes (cifar10_subset
    # after round 0: 6 to 8 of 10 class maps below 0 on 1,000 images, every SqueezeNet client). Logits stay signed.
    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    model.classifier[2] = nn.Identity()
    stem = model.features[0]
    if small:
        # 3x3 stride-1 first conv; the three ceil-mode 3x3/2 max-pools then give
        # 32 -> 16 -> 8 -> 4, 28 -> 14 -> 7 -> 3 and 8 -> 4 -> 2 -> 1 (never 0).
        model.features[0] = nn.Conv2d(in_chans, stem.out_channels, kernel_size=3, stride=1, padding=1)
    elif in_chans != 3:
        model.features[0] = _conv_like(stem, in_chans)
    return model


# ---------------------------------------------------------------------------
# timm small-input adaptations
# ---------------------------------------------------------------------------
def _is_timm_vgg(name: str) -> bool:
    import timm  # here, not at import: the CLI checks settings without it

    return timm.models.get_arch_name(name) in timm.list_models(module="vgg")


def _adapt_timm_small(model: nn.Module, image_size: int) -> None:
    from timm.models.resnet import ResNet
    from timm.models.vgg import VGG

    if isinstance(model, ResNet):
        if isinstance(model.conv1, nn.Conv2d):
            # Single 7x7/2 stem (resnet18/34/50...) -> 3x3/1, padding 1.
            model.conv1 = _conv_like(
                model.conv1, model.conv1.in_channels, kernel_size=3, stride=1, padding=1
            )
        else:
            # Deep stem (resnet10t, test_resnet, resnet*d ...): first conv stride -> 1.
            conv = _first_conv(model.conv1)
            if conv is not None:
                conv.stride = (1, 1)
        model.maxpool = nn.Identity()
    elif isinstance(model, VGG):
        # Drop the 4096-wide ImageNet head (ConvMlp 512x7x7 -> 4096 -> 4096 + fc):
        # global average pool + Linear(512, num_classes).
        from timm.layers import ClassifierHead

        model.pre_logits = nn.Identity()
        model.head = ClassifierHead(model.num_features, model.num_classes, pool_type="avg")
        model.head_hidden_size = model.num_features
        # Ceil-mode pools: identical for even sizes (32 -> 1), but 28 -> 14 -> 7 -> 4
        # -> 2 -> 1 and 8 -> 4 -> 2 -> 1 -> 1 -> 1 instead of collapsing to 0.
        for m in model.features.modules():
            if isinstance(m, nn.MaxPool2d):
                m.ceil_mode = True
    elif hasattr(model, "conv_stem") and image_size <= _CONV_STEM_STRIDE1_MAX_SIZE:
        # MobileNetV2/V3, EfficientNet, LCNet, GhostNet, ...: stem stride 2 -> 1.
        conv = _first_conv(model.conv_stem)
        if conv is not None:
            conv.stride = (1, 1)


# ---------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------
def create_backbone(name: str, num_classes: int, in_chans: int = 3, image_size: int = 32) -> nn.Module:
    """Create a randomly initialised classification backbone.

    Model families follow the COSMOS paper (Section 6; architectures and
    initialisation in Appendix C). Weights are never downloaded: timm models are
    created with ``pretrained=False``, torchvision ones with ``weights=None``, and
    every backbone is re-initialised with :func:`kaiming_init_`.

    Small-input adaptations (``image_size <= 64``, CIFAR practice):

    * timm ``ResNet`` (resnet18/34/50, resnet10t, test_resnet, ...): a single 7x7/2
      stem conv becomes 3x3 stride 1 padding 1; for deep stems the first conv's
      stride becomes 1; ``maxpool`` becomes ``nn.Identity``.
    * timm ``VGG`` (vgg11/13/16/19 and ``_bn``): the 4096-wide head is replaced by
      global average pooling + ``Linear(512, num_classes)`` (vgg16: ~14.7M instead
      of ~134M parameters); max-pools use ``ceil_mode`` so 28x28 and 8x8 inputs work.
    * timm models with a ``conv_stem`` (MobileNetV2/V3, EfficientNet, LCNet,
      GhostNet, ...): stem stride 1 when ``image_size <= 32`` (kept at 2 for 33..64).
    * torchvision ``alexnet``: a CIFAR AlexNet (3x3 stride-1 convs 64-192-384-256-256,
      three 2x2 max-pools, ``AdaptiveAvgPool2d(2)``, classifier 1024-1024-1024-M,
      ~4.4M parameters). Above 64 the stock torchvision AlexNet.
    * torchvision ``squeezenet1_0`` / ``squeezenet1_1``: first conv 3x3 stride 1
      padding 1. Above 64 the stock stem (only ``in_chans`` adapted). At every size the head's final ReLU is
      removed (signed logits; a clamped logit map gets no gradient, see :data:`BACKBONE_REVISION`).

    Other timm families are created unchanged (e.g. ViTs need a matching
    ``img_size`` and are not adapted here).

    Args:
        name: A timm architecture name (see ``timm.list_models()``; without a pretrained
            tag such as ``.a1_in1k``, since no weights are loaded) or one of
            :data:`TORCHVISION_BACKBONES`.
        num_classes: Number of output logits ``M`` (>= 1).
        in_chans: Input channels ``C`` (1 for (Fashion-)MNIST/digits, 3 for RGB).
        image_size: Input side length ``H = W`` the model will see; selects the
            small-input adaptations above.

    Returns:
        ``nn.Module`` mapping a float tensor ``[B, C, H, W]`` to logits
        ``[B, num_classes]``.

    Raises:
        ConfigError: ``name`` is not a timm or torchvision backbone (the message lists
            up to 5 close names and how to list valid ones), or has a pretrained tag.
        ValueError: ``num_classes``, ``in_chans`` or ``image_size`` is not a positive integer.
    """
    import timm  # here, not at import: the CLI checks settings without it

    for arg_name, value in (("num_classes", num_classes), ("in_chans", in_chans), ("image_size", image_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg_name} must be a positive int, got {value!r}")
    small = image_size <= SMALL_INPUT_MAX_SIZE

    if _pretrained_tag(name) is not None and timm.is_model(name):
        raise _pretrained_tag_error(name, "backbone")
    if name in TORCHVISION_BACKBONES:
        model = _create_torchvision(name, num_classes, in_chans, small=small)
    elif isinstance(name, str) and timm.is_model(name):
        kwargs = {}
        if small and _is_timm_vgg(name):
            # The 4096-wide ImageNet head is discarded below; shrink its hidden ConvMlp
            # width to 1 so the ~100M-parameter 512x7x7 -> 4096 conv is never allocated.
            kwargs["mlp_ratio"] = 1.0 / 4096
        model = timm.create_model(
            name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **kwargs
        )
        if small:
            _adapt_timm_small(model, image_size)
    else:
        raise _unknown_backbone_error(str(name))

    return kaiming_init_(model)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters of ``model`` (what its float32 weights cost: 4 bytes each)."""
    return sum(p.numel() for p in model.parameters())
