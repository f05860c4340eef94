"""Small files of the data sets with natural clients from their publishers (WILDS's Camelyon17 and iWildCam
downloads, UCI's PAMAP2 archive), in each one's exact layout; each writer returns what it wrote."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

# --- WILDS ---------------------------------------------------------------------------------------------------
#: the columns of WILDS's metadata.csv files (pandas's unnamed index first)
CAMELYON_COLUMNS = ("", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split")
IWILDCAM_COLUMNS = ("", "split", "location_remapped", "location", "sequence_remapped", "seq_id", "y", "category_id", "datetime",
                    "filename", "image_id")


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([[i if c == "" else row[c] for c in columns] for i, row in enumerate(rows)])


def camelyon_patch(tumour: int, center: int, rng: np.random.Generator) -> np.ndarray:
    """A 96x96 patch ``(3, 96, 96)``: red 200 for a tumour (else 0), green 40 per hospital, plus noise."""
    x = rng.integers(0, 40, size=(3, 96, 96))
    x[0] += 200 * tumour
    x[1] += 40 * center
    return x.astype(np.uint8)


def write_camelyon17(root: Path, per_hospital: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    """WILDS's ``camelyon17_v1.0/``: ``metadata.csv`` and ``patches/patient_<p>_node_<n>/patch_patient_<p>_node_<n>_x_<x>_y_<y>.png``
    (zero-padded patients, as WILDS's), ``per_hospital`` patches of each of the 5 hospitals, the hospitals
    interleaved in the file. Returns the patches ``(n, 3, 96, 96)``, tumour labels, hospitals and paths in
    the file's order."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = root / "camelyon17_v1.0"
    rows, xs, paths = [], [], []
    for i in range(5 * per_hospital):
        center, tumour = i % 5, int(rng.integers(0, 2))
        patient, node, x, y = f"{10 * center + i % 3:03d}", i % 4, 96 * i, 32 * (i % 7)
        path = f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png"
        image = camelyon_patch(tumour, center, rng)
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.transpose(1, 2, 0), "RGB").save(folder / path)
        rows.append({"patient": patient, "node": node, "x_coord": x, "y_coord": y, "tumor": tumour, "slide": 10 * center + i % 3,
                     "center": center, "split": int(i % 7 == 0)})
        xs.append(image)
        paths.append(path)
    write_csv(folder / "metadata.csv", CAMELYON_COLUMNS, rows)
    return {"x": np.stack(xs), "y": np.asarray([r["tumor"] for r in rows]), "center": np.asarray([r["center"] for r in rows]),
            "path": np.asarray(paths)}


def iwildcam_colour(label: int, trap: int) -> tuple[int, int, int]:
    """The solid colour of the fixture's photo of class ``label`` at trap ``trap``."""
    return (label, 20 + 15 * trap, 90)


#: the fixture's traps (location_remapped) and their photos' labels: with a minimum of 3 samples, trap 2 (5
#: photos of 3 classes) and trap 11 (4 photos of 3 classes) are kept; trap 5 has 2 classes only, trap 7 3 photos
IWILDCAM_TRAPS = {2: (0, 181, 17, 0, 17), 5: (3, 3, 9, 9, 3), 7: (0, 1, 2), 11: (146, 3, 0, 3)}
#: the photo sizes (width, height), in turn: WILDS's are 448 high, of several widths
IWILDCAM_SIZES = ((80, 60), (60, 90), (64, 64))
#: the grey level of the fixture's one greyscale photo, trap 11's last
IWILDCAM_GREY = 128


def write_iwildcam(root: Path) -> dict[str, np.ndarray]:
    """WILDS's ``iwildcam_v2.0/``: ``metadata.csv`` and ``train/<uuid>.jpg``, each photo a solid
    ``iwildcam_colour`` of its label and trap, of ``IWILDCAM_SIZES`` in turn, save trap 11's last: greyscale,
    ``IWILDCAM_GREY``. Returns the labels, traps, colours and file names in the file's order."""
    from PIL import Image

    folder = root / "iwildcam_v2.0"
    (folder / "train").mkdir(parents=True)
    rows, colours = [], []
    for trap, labels in IWILDCAM_TRAPS.items():
        for j, label in enumerate(labels):
            k = len(rows)
            name = f"{k:08x}-21bc-11ea-a13a-137349068a90.jpg"
            size = IWILDCAM_SIZES[k % len(IWILDCAM_SIZES)]
            if trap == 11 and j == len(labels) - 1:
                colour, image = (IWILDCAM_GREY,) * 3, Image.new("L", size, IWILDCAM_GREY)
            else:
                colour = iwildcam_colour(label, trap)
                image = Image.new("RGB", size, colour)
            image.save(folder / "train" / name, quality=95)
            rows.append({"split": "train" if j % 2 else "id_val", "location_remapped": trap, "location": 100 + trap,
                         "sequence_remapped": k // 2, "seq_id": f"30{k // 2:06d}-21bc-11ea", "y": label,
                         "category_id": 1000 + label, "datetime": f"2013-06-{1 + k:02d} 16:11:00.000", "filename": name,
                         "image_id": name[:-4]})
            colours.append(colour)
    write_csv(folder / "metadata.csv", IWILDCAM_COLUMNS, rows)
    return {"y": np.asarray([r["y"] for r in rows]), "trap": np.asarray([r["location_remapped"] for r in rows]),
            "colour": np.asarray(colours), "filename": np.asarray([r["filename"] for r in rows])}


# --- PAMAP2 --------------------------------------------------------------------------------------------------
#: each subject's protocol activities (two bouts besides transient, rope jumping and a short walk)
PAMAP2_BOUTS = {101: (1, 2), 102: (3, 12), 103: (13, 16), 104: (5, 6), 105: (7, 17), 106: (1, 13), 107: (2, 3), 108: (12, 16),
                109: (4, 5)}
#: the subjects with an Optional file (UCI's: 101, 105, 106, 108, 109; two of them here)
PAMAP2_OPTIONAL = (101, 105)
#: the 0-based columns of the 27 signals PFLlib keeps (each IMU's 16g acceleration, gyroscope, magnetometer)
PAMAP2_SIGNALS = (4, 5, 6, 10, 11, 12, 13, 14, 15, 21, 22, 23, 27, 28, 29, 30, 31, 32, 38, 39, 40, 44, 45, 46, 47, 48, 49)


def protocol_bouts(subject: int) -> list[tuple[int, int]]:
    """(activity id, rows) of a subject's protocol file: transient 40 rows, activity A 384 rows (two windows),
    B 300 (one), transient 20, rope jumping 256 (one), walking 255 (too short for a window)."""
    a, b = PAMAP2_BOUTS[subject]
    return [(0, 40), (a, 384), (b, 300), (0, 20), (24, 256), (4, 255)]


#: an optional file's bouts: computer work (an optional activity, left out), transient, ironing (one window)
OPTIONAL_BOUTS = [(10, 300), (0, 10), (17, 260)]


def pamap2_signal(rows: np.ndarray, k: int) -> np.ndarray:
    """Signal ``k``'s reading at ``rows`` (not the outlier): ``10 (k + 1) (k + row mod 50)``."""
    return 10.0 * (k + 1) * (k + np.asarray(rows) % 50)


def pamap2_outlier(optional: bool) -> np.ndarray:
    """The 27 signals' readings of row 5 of a file (transient): ``-1000 (k + 1)``, twice that in an Optional
    file; each signal's largest absolute value in the subject's files, larger than any other reading."""
    return -1000.0 * (np.arange(27) + 1) * (2 if optional else 1)


def nan_cells(subject: int) -> list[tuple[int | slice, int]]:
    """(rows, signal) of the protocol file left NaN: subject 102's signal 0 in rows 50-59, subject 109's ankle
    magnetometer z (signal 26) everywhere."""
    return {102: [(slice(50, 60), 0)], 109: [(slice(None), 26)]}.get(subject, [])


def pamap2_table(bouts: list[tuple[int, int]], subject: int, optional: bool) -> np.ndarray:
    """A .dat file's 54 columns: the signals by ``pamap2_signal`` (row 5: ``pamap2_outlier``), every other
    column 999 save a heart rate read every 10th row (NaN between), and orientation NaN."""
    activity = np.concatenate([np.full(n, a) for a, n in bouts]).astype(float)
    rows = np.arange(len(activity))
    table = np.full((len(rows), 54), 999.0)
    table[:, 0], table[:, 1] = rows / 100, activity
    table[:, 2] = np.where(rows % 10 == 0, 100.0, np.nan)
    for imu in (3, 20, 37):
        table[:, imu + 13:imu + 17] = np.nan  # orientation: "invalid in this data collection"
    for k, column in enumerate(PAMAP2_SIGNALS):
        table[:, column] = pamap2_signal(rows, k)
    table[5, list(PAMAP2_SIGNALS)] = pamap2_outlier(optional)
    if not optional:
        for cells, k in nan_cells(subject):
            table[cells, PAMAP2_SIGNALS[k]] = np.nan
    return table


def write_dat(path: Path, table: np.ndarray) -> None:
    """Space-separated numbers, ``NaN`` as UCI writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join("NaN" if np.isnan(v) else f"{v:g}" for v in row) + "\n" for row in table))


def write_pamap2(root: Path) -> dict[int, dict[str, np.ndarray]]:
    """UCI's ``PAMAP2_Dataset/Protocol/subject101.dat`` ... ``subject109.dat`` and ``Optional/subject<id>.dat`` of
    ``PAMAP2_OPTIONAL``; returns each subject's tables (``protocol``, ``optional``)."""
    out: dict[int, dict[str, np.ndarray]] = {}
    for subject in PAMAP2_BOUTS:
        out[subject] = {"protocol": pamap2_table(protocol_bouts(subject), subject, False)}
        write_dat(root / "PAMAP2_Dataset" / "Protocol" / f"subject{subject}.dat", out[subject]["protocol"])
        if subject in PAMAP2_OPTIONAL:
            out[subject]["optional"] = pamap2_table(OPTIONAL_BOUTS, subject, True)
            write_dat(root / "PAMAP2_Dataset" / "Optional" / f"subject{subject}.dat", out[subject]["optional"])
    return out
