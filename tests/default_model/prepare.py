#!/usr/bin/env python3
"""Builds the training text of the built-in default model from the King James Bible (1611; its
copyright long expired) as Debian ships it: packages bible-kjv (the `bible` reader) and
bible-kjv-text. Standard library only.

    python3 tests/default_model/prepare.py --out DIR

writes into DIR:
  pretrain.txt   the chapters not held out, one chapter a paragraph, chapters apart by a blank line
  valid.txt      every 25th chapter from the 13th (never trained on): training stops early on it
  heldout.txt    every 25th chapter from the 25th (never trained on, never used to choose
                 anything): perplexity and routing traces use it
  chat.txt       ChatML conversations the script makes from the verses (a recitation, the verse
                 that follows, the book a verse is from, who the model is), one per line pair
                 group, each ending "<|im_end|>\\n"; apart by "\\n\\n"
  prompts.json   the three fixed chat prompts the README and the tests show
"""
import argparse
import json
import os
import random
import re
import subprocess

# `bible` prints "Ge1:1 In the beginning ...": its book abbreviations, in order, and their names.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]
NAME = dict(BOOKS)
HELDOUT_EVERY = 25

# Three fixed prompts: shown in the README, checked by tests/default_model tests.
PROMPTS = [
    "Who are you?",
    "Recite Genesis 1:1.",
    "What comes after: And God said, Let there be light: and there was light.",
]

IDENTITY = [
    ("Who are you?",
     "I am the small default model of moe-serve, trained on the King James Bible. "
     "I am tiny and not a useful assistant."),
    ("What are you?",
     "A small mixture-of-experts language model that the moe-serve project trained on the "
     "King James Bible, to show that the engine works."),
    ("What can you do?",
     "I can recite verses of the King James Bible and continue them, often wrongly. "
     "I am tiny and not a useful assistant."),
    ("Hello", "Hello. I am the small default model of moe-serve. Ask me for a verse."),
]


def verses():
    text = subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"], check=True,
                          capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise SystemExit(f"unexpected line from bible: {line!r}")
        out.append((NAME[m.group(1)], int(m.group(2)), int(m.group(3)), m.group(4).strip()))
    if len(out) != 31102:
        raise SystemExit(f"expected 31102 verses, got {len(out)}")
    return out


def chat(user, assistant):
    return (f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{assistant}<|im_end|>\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    vs = verses()

    chapters = {}
    for book, c, v, t in vs:
        chapters.setdefault((book, c), []).append(t)
    keys = list(chapters)
    heldout = {k for i, k in enumerate(keys) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1}
    valid = {k for i, k in enumerate(keys) if i % HELDOUT_EVERY == HELDOUT_EVERY // 2}
    unseen = heldout | valid
    for name, chosen in (("pretrain", lambda k: k not in unseen), ("valid", valid.__contains__),
                         ("heldout", heldout.__contains__)):
        with open(os.path.join(args.out, name + ".txt"), "w") as f:
            f.write("\n\n".join(" ".join(chapters[k]) for k in keys if chosen(k)) + "\n")

    # Chat turns only from trained chapters; the fixed prompts' own answers are among them.
    rng = random.Random(20261127)
    trained = [(i, x) for i, x in enumerate(vs) if (x[0], x[1]) not in unseen]
    convs = []
    for i, (book, c, v, t) in trained:
        kind = rng.randrange(3)
        if kind == 0:
            convs.append(chat(f"Recite {book} {c}:{v}.", t))
        elif kind == 1 and i + 1 < len(vs) and vs[i + 1][0] == book:
            convs.append(chat(f"What comes after: {t}", vs[i + 1][3]))
        else:
            convs.append(chat(f"Which book says: {t}", f"The book of {book}, chapter {c}."))
    g11 = chat("Recite Genesis 1:1.", vs[0][3])
    g13 = chat(f"What comes after: {vs[2][3]}", vs[3][3])
    for _ in range(200):
        convs += [chat(q, a) for q, a in IDENTITY] + [g11, g13]
    rng.shuffle(convs)
    with open(os.path.join(args.out, "chat.txt"), "w") as f:
        f.write("\n".join(convs))
    with open(os.path.join(args.out, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f, indent=1)
    print(f"{len(vs)} verses, {len(keys)} chapters ({len(valid)} validation, "
          f"{len(heldout)} held out), "
          f"{len(convs)} chat conversations")


if __name__ == "__main__":
    main()
