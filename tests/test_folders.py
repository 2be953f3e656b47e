"""Image folders: every file type the folder reader takes is decoded alike, undecodable files are found in one pass
and named together, and a class with training images but no test images is refused."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos_pl.data import ImageFolderData
from cosmos_pl.data.datasets.folders import IMAGE_SUFFIXES, _reason, decode_images
from cosmos_pl.errors import DataError

RGB = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) * 4  # [H, W, C], values 0..236
GRAY = RGB[..., 0]


def _chw(hwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(hwc.copy()).permute(2, 0, 1)


def _write_rgb16_tiff(path, a: np.ndarray) -> None:
    """A baseline uncompressed TIFF of uint16 [H, W, 3] (Pillow writes no 16-bit RGB)."""
    h, w, _ = a.shape
    data = a.astype("<u2").tobytes()
    bits, pixels = 8, 14  # offsets: the three BitsPerSample values, then the pixels, then the directory
    tags = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, bits), (259, 3, 1, 1), (262, 3, 1, 2), (273, 4, 1, pixels),
            (277, 3, 1, 3), (278, 3, 1, h), (279, 4, 1, len(data)), (284, 3, 1, 1)]
    out = b"II*\x00" + struct.pack("<I", pixels + len(data)) + struct.pack("<3H", 16, 16, 16) + data
    out += struct.pack("<H", len(tags))
    for tag, kind, count, value in tags:
        packed = struct.pack("<HH", value, 0) if kind == 3 and count == 1 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, count) + packed
    path.write_bytes(out + struct.pack("<I", 0))


def test_the_suffixes_are_imagefolders():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert IMAGE_SUFFIXES == IMG_EXTENSIONS  # what ImageFolder lists is what decode_images reads


def test_every_accepted_file_type_is_decoded_to_the_same_pixels(tmp_path):
    paths = []
    for suffix in IMAGE_SUFFIXES:
        path = tmp_path / f"img{suffix.upper() if suffix == '.png' else suffix}"  # any case: .PNG too
        if suffix == ".pgm":  # grayscale only: three equal channels
            Image.fromarray(GRAY).save(path)
        else:
            Image.fromarray(RGB).save(path, **({"lossless": True} if suffix == ".webp" else {}))
        paths.append(str(path))
    x = decode_images(paths)
    assert x.dtype == torch.uint8 and x.shape == (len(IMAGE_SUFFIXES), 3, 4, 5)
    for path, img in zip(paths, x):
        if path.endswith((".jpg", ".jpeg")):  # lossy: close, not equal
            assert (img.int() - _chw(RGB).int()).abs().max() <= 12, path
        elif path.endswith(".pgm"):
            assert torch.equal(img, _chw(np.repeat(GRAY[..., None], 3, axis=2))), path
        else:
            assert torch.equal(img, _chw(RGB)), path


def test_modes_convert_as_png_does(tmp_path):
    """Grayscale spreads to three channels, alpha is dropped, 16 bits keep their high byte: the same for a PNG
    (torchvision) and a TIFF (Pillow)."""
    rgba = np.dstack([RGB, np.full((4, 5), 50, np.uint8)])
    sixteen = np.array([[0, 1000, 40000, 65535]], dtype=np.uint16)  # >> 8: 0, 3, 156, 255
    for suffix in (".png", ".tif"):
        Image.fromarray(GRAY).save(tmp_path / f"gray{suffix}")
        Image.fromarray(rgba, "RGBA").save(tmp_path / f"rgba{suffix}")
        Image.fromarray(sixteen).save(tmp_path / f"gray16{suffix}")
        gray, alpha = decode_images([str(tmp_path / f"gray{suffix}"), str(tmp_path / f"rgba{suffix}")])
        assert torch.equal(gray, _chw(np.repeat(GRAY[..., None], 3, axis=2))) and torch.equal(alpha, _chw(RGB))
        deep = decode_images([str(tmp_path / f"gray16{suffix}")])
        assert deep.dtype == torch.uint8 and deep[0].tolist() == [[[0, 3, 156, 255]]] * 3, suffix
    _write_rgb16_tiff(tmp_path / "rgb16.tif", np.broadcast_to(np.array([65535, 1000, 40000], np.uint16), (2, 3, 3)))
    assert decode_images([str(tmp_path / "rgb16.tif")])[0, :, 0, 0].tolist() == [255, 3, 156]
    Image.fromarray(np.zeros((2, 2), np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(DataError, match=r"float\.tif cannot be decoded \(32-bit float pixels \(Pillow mode F\) have "
                                        r"no 8-bit scale: save it with 8 or 16 bits per sample\)"):
        decode_images([str(tmp_path / "float.tif")])


def test_a_decoders_reason_is_one_clean_clause():
    torchvision = RuntimeError("decode_image, /__w/vision/vision/pytorch/vision/torchvision/csrc/io/image/cpu/"
                               "decode_image.cpp:67, Unsupported image file. Only jpeg, png, webp and gif are currently"
                               " supported. For avif and heic format, please rely on `decode_avif` and `decode_heic` "
                               "directly.")
    assert _reason(torchvision, "a.png") == ("Unsupported image file. Only jpeg, png, webp and gif are currently "
                                             "supported")
    old_torch = RuntimeError("Image is incomplete or truncated\nException raised from decode_jpeg at /x/y.cpp:1 "
                             "(most recent call first):\nframe #0: c10::Error")
    assert _reason(old_torch, "a.jpg") == "Image is incomplete or truncated"
    assert _reason(OSError("cannot identify image file '/d/b.tif'"), "/d/b.tif") == "cannot identify image file"
    long = ValueError("word " * 40)  # one sentence of 199 characters: cut at a word, never inside one
    assert _reason(long, "c.bmp") == ("word " * 30).strip() + " ..."


def _folder(root, files, size=4):
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(root / rel)


def test_three_undecodable_files_are_named_in_one_error(tmp_path):
    root = tmp_path / "images"
    files = ["train/a/0.png", "train/a/1.bmp", "train/b/2.tif", "train/b/3.png", "test/a/4.jpg", "test/b/5.ppm"]
    _folder(root, files)
    broken = [root / "train/a/1.bmp", root / "train/b/3.png", root / "test/b/5.ppm"]
    for path in broken:
        path.write_bytes(path.read_bytes()[:20])  # truncated
    with pytest.raises(DataError) as e:
        ImageFolderData(str(root)).load()
    msg = str(e.value)
    assert msg.startswith(f"3 of the 6 image files cannot be decoded: {broken[0]} (")
    assert [msg.index(f"{p} (") for p in broken] == sorted(msg.index(f"{p} (") for p in broken)  # all, in order
    assert msg.endswith("Replace them with readable images (JPEG, PNG, WebP, BMP, TIFF, PPM or PGM, 8 or 16 bits per "
                        "sample), or remove them")
    assert ".cpp" not in msg and "/__w/" not in msg and "\n" not in msg


def test_past_five_undecodable_files_the_rest_are_counted(tmp_path):
    paths = []
    for i in range(7):
        paths.append(tmp_path / f"{i}.png")
        paths[-1].write_bytes(b"not an image")
    Image.fromarray(RGB).save(tmp_path / "ok.png")
    with pytest.raises(DataError) as e:
        decode_images([str(p) for p in paths] + [str(tmp_path / "ok.png")])
    msg = str(e.value)
    assert msg.startswith("7 of the 8 image files cannot be decoded: ")
    assert all(f"{p} (" in msg for p in paths[:5]) and str(paths[5]) not in msg and str(paths[6]) not in msg
    assert "; and 2 more. Replace them" in msg


def test_a_class_without_test_images_is_refused_before_decoding(tmp_path):
    root = tmp_path / "images"
    _folder(root, ["train/a/0.png", "train/a/1.png", "train/b/2.png", "train/b/3.png", "train/b/4.png",
                   "train/c/5.png", "test/a/6.png"])
    (root / "train/c/5.png").write_bytes(b"broken")  # never decoded: the folders are refused first
    with pytest.raises(DataError) as e:
        ImageFolderData(str(root)).load()
    assert str(e.value) == (
        f"data set 'images' ({root}): 2 class(es) with training samples have no test samples: 'b' (3 training, "
        "0 test), 'c' (1 training, 0 test). Each client's test set is drawn in proportion to its own training "
        "classes, so a client holding these would be scored on fewer test samples and never on them: add images of "
        f"each to {root / 'test'}/<class>/, or move its folder out of {root / 'train'}")


def _blocks(text: str, language: str) -> list[str]:
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith(language + "\n")]


def test_the_own_data_pages_example_does_what_the_page_says(repo_root, tmp_path, monkeypatch):
    """docs/own-data.md: its script writes the folder, its config builds the federation the page describes (no
    training), its bad-file error is the one a run prints, and its split snippet splits."""
    from cosmos_pl.parsers import build_fit_parser

    page = (repo_root / "docs" / "own-data.md").read_text()
    make_images, split = _blocks(page, "python")
    (config,) = _blocks(page, "yaml")
    monkeypatch.chdir(tmp_path)
    exec(make_images, {})
    assert sorted(p.suffix for p in (tmp_path / "my_images/train/circle").iterdir()) == [".bmp"] * 10 + [".tif"] * 10
    (tmp_path / "my_images.yaml").write_text(config)
    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_args(["--config", "my_images.yaml"]))
    data, fed = init.data.build(init.seed)
    assert data.classes == ["circle", "square", "stripe"] and data.x_train.shape == (60, 3, 16, 16)
    # the page: "3 clients, |U| = 12, M = 3", class_counts [4, 5, 6], [10, 3, 5], [1, 6, 8], test sets of 10 each
    assert len(fed.public) == 12 and fed.num_clients == 3 and fed.num_classes == 3
    assert [c.class_counts.tolist() for c in fed.clients] == [[4, 5, 6], [10, 3, 5], [1, 6, 8]]
    assert [len(c.y_test) for c in fed.clients] == [10, 10, 10]
    for rel in ("train/circle/4.bmp", "train/square/7.tif", "test/stripe/2.bmp"):
        path = tmp_path / "my_images" / rel
        path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError) as e:
        init.data.build(init.seed)
    (shown,) = [b for b in _blocks(page, "text") if b.startswith("cosmos-pl: error: 3 of the 90")]
    assert "cosmos-pl: error: " + str(e.value) == " ".join(shown.split())

    for name, n in (("a", 5), ("b", 3)):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(RGB).save(tmp_path / "photos" / name / f"{i}.png")
    (tmp_path / "photos" / "a" / "notes.txt").write_text("not an image")
    shutil.rmtree(tmp_path / "my_images")
    exec(split, {})
    # 20% to test, at least 1: a: round(0.2 * 5) = 1 of 5; b: round(0.6) = 1 of 3
    counts = {(s, c): len(list((tmp_path / "my_images" / s / c).iterdir())) for s in ("train", "test") for c in "ab"}
    assert counts == {("train", "a"): 4, ("train", "b"): 2, ("test", "a"): 1, ("test", "b"): 1}
