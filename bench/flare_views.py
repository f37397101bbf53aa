#!/usr/bin/env python3
"""A real set of game characters in four view classes, cut from Debian's flare-game package.

The generator's fidelity targets are judged on a set of game characters whose classes are the
character's facing; this builds one like it for development: Flare's enemy sprite atlases (goblins,
skeletons, zombies, minotaurs, ants, wyverns; rendered art with soft shadows and antialiased
edges), one class per facing (Flare's directions 0, 2, 4 and 6 of 8), each frame pasted on a
64x64 transparent canvas with its anchor (the feet) at (32, 52), frames too large for it scaled
down to fit; identical frames kept once; `--per-class` frames drawn per class (seeded).

    apt-get download flare-game && dpkg-deb -x flare-game_*.deb flare   # CC-BY-SA 3.0 art
    apt-get install python3-pil
    /usr/bin/python3 bench/flare_views.py flare/usr/share/games/flare/mods views --per-class 900
    spritetorch train --task generate --dataset folder:views --size 32 --save gen.pt

Animations that only reuse another's frames with a tint (color_mod, alpha_mod) are kept, tinted;
boulders, graves and the minecart (no facing) are left out.
"""
import argparse
import glob
import hashlib
import os
import random

from PIL import Image

VIEWS = {0: "view0", 2: "view2", 4: "view4", 6: "view6"}
NO_FACING = ("boulder", "cursed_grave", "minecart")


def animation_lines(mods, txt):
    """The definition's lines with INCLUDE resolved, and its (r, g, b, a) tint."""
    lines = open(txt).read().splitlines()
    tint = [255, 255, 255, 255]
    for line in list(lines):
        if line.startswith("color_mod="):
            tint[:3] = map(int, line[len("color_mod="):].split(","))
        elif line.startswith("alpha_mod="):
            tint[3] = int(line[len("alpha_mod="):])
        elif line.startswith("INCLUDE "):
            lines = open(glob.glob(os.path.join(mods, "*", line[8:].strip()))[0]).read().splitlines()
    return lines, tuple(tint)


def on_canvas(frame, anchor_x, anchor_y):
    w, h = frame.size
    left, top = 32 - anchor_x, 52 - anchor_y
    if left < 0 or top < 0 or left + w > 64 or top + h > 64:
        s = min(64 / w, 64 / h, 1.0)
        frame = frame.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BOX)
        w, h = frame.size
        left = min(max(0, 32 - round(anchor_x * s)), 64 - w)
        top = min(max(0, 52 - round(anchor_y * s)), 64 - h)
    canvas = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    canvas.paste(frame, (left, top))
    return canvas


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mods", help="flare's mods folder (.../usr/share/games/flare/mods)")
    parser.add_argument("out", help="folder to write OUT/<view>/*.png into (must not exist)")
    parser.add_argument("--per-class", type=int, default=900)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    frames = {view: [] for view in VIEWS.values()}
    seen = set()
    for txt in sorted(glob.glob(os.path.join(args.mods, "*", "animations", "enemies", "*.txt"))):
        if any(word in txt for word in NO_FACING):
            continue
        lines, tint = animation_lines(args.mods, txt)
        if lines and lines[0].strip() == "APPEND":  # more animations on another file's image
            continue
        image = [l.split("=", 1)[1] for l in lines if l.startswith("image=")][0]
        sheet = Image.open(glob.glob(os.path.join(args.mods, "*", image))[0]).convert("RGBA")
        if tint != (255, 255, 255, 255):
            bands = [b.point(lambda v, m=m: v * m // 255) for b, m in zip(sheet.split(), tint)]
            sheet = Image.merge("RGBA", bands)
        name = os.path.basename(txt)[:-4]
        for line in lines:
            if not line.startswith("frame="):
                continue
            _, direction, x, y, w, h, ax, ay = map(int, line[len("frame="):].split(","))
            if direction not in VIEWS or w == 0 or h == 0:
                continue
            frame = sheet.crop((x, y, x + w, y + h))
            key = hashlib.md5(frame.tobytes() + bytes([direction])).hexdigest()
            if key not in seen:
                seen.add(key)
                items = frames[VIEWS[direction]]
                items.append((f"{name}_{len(items) + 1:04d}.png", on_canvas(frame, ax, ay)))
    rng = random.Random(args.seed)
    os.makedirs(args.out)
    for view in sorted(frames):
        items = dict(frames[view])
        os.makedirs(os.path.join(args.out, view))
        picked = rng.sample(sorted(items), min(args.per_class, len(items)))
        for file in picked:
            items[file].save(os.path.join(args.out, view, file))
        print(f"{view}: {len(picked)} of {len(items)} frames")


if __name__ == "__main__":
    main()
