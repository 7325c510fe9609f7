"""Verifier for dedupe-files-by-content (expected state computed from the pristine folder)."""

import hashlib
import pathlib

ROOT = pathlib.Path("/app/photos")
REMOVED = pathlib.Path("/app/removed.txt")

EXPECTED_KEPT = {
    "2023/summer/IMG_0004.jpg": "5cb25f2548fe401c0b717ed90dbad628eecf3de779729e2e0e624553cfbb69ac",
    "2023/summer/IMG_0039.jpg": "982f8b83caff1803bd3b9da483251fabe66a9f710613f100dc67cab3ff177b12",
    "2023/summer/IMG_0101.jpg": "c82db81756a8edd8ab24bfc8f57abe593a2b19595c0ed38415b71bbf5df1c4b6",
    "2023/summer/IMG_0102.jpg": "f8e6d60add0622e78feba3b659f03d4c9a59e0a0be45dccc6c1cac5e16e10150",
    "2023/winter/IMG_0019.jpg": "5678a34ad93b2d828eb2ee9d66ad14af56fb7141055eb09adb14fde498cece56",
    "2023/winter/IMG_0024.jpg": "7e69bf776abb7f4f8ff8882796dfee758d4075efb28a8a33d9b9f557f4b44086",
    "2023/winter/IMG_0069.jpg": "8e2d7194ecd768e2e75242c25b36689227541a0ed57df27abd069d56f61af97e",
    "2023/winter/IMG_0077.jpg": "94884cf6f852bcf6ff4a3e005755dc50850b4fcd2e375dbba216bb47d03f1c2f",
    "2023/winter/IMG_0086.jpg": "9d8864c5abab027c05a75302a7bfa0e144c508cf7a7afa1bb0e23852ba82acd7",
    "2023/winter/IMG_0103.jpg": "e47b89640b11fef4ea2612c8f828e632fb5cf25f2738200e7c8bda4e9657958c",
    "2023/winter/IMG_0118.jpg": "e798634cfc8d538b722db5c663933576e5379a0f278831cbd690abed85d8ca46",
    "2023/winter/IMG_0138.jpg": "27f2ee56c22d4ddffcf781872a734834dc70242592f88416471316d0a735b8f1",
    "2023/winter/IMG_0169.jpg": "9bcefa18157bd59813531350a0d7a2c7393b3a8b9b81e225b1f0139f5a313e92",
    "2023/winter/IMG_0176.jpg": "bb691b3fa6b740d4aa5c5b2b24c8caaea873978809e026bfea5ec7a518456115",
    "2023/winter/IMG_0189.jpg": "2155c09f75845649114eda2e0d4135e7741cc83a291cf6cd9f962f4aaa4e349d",
    "2023/winter/IMG_0196.jpg": "549372fbc516404d4e01bab4dfb574fe6650bcbc2bc862e3a76307775fe32b65",
    "2024/family/IMG_0013.jpg": "173e73dfbbb6fad20d5c5eb68e9478fc267bd451511a997231dfcb755a1caf28",
    "2024/family/IMG_0038.jpg": "c13785991e748ebc05a10de0863fb96a550076e5ec3a9b55a81b41253e0eef38",
    "2024/family/IMG_0048.jpg": "edb6ee633790de60a69bdd5c142c71f01862d20082d458253596448fc378ce84",
    "2024/family/IMG_0117.jpg": "0e1841c20de0007e87c9de3e02185814441f93349847b66469520b995b68cbbf",
    "2024/trip to lisbon/IMG_0092.jpg": "0b1b9a1f93e21dab6673daa01c158c2e07a92b88ecefd7c893305c777bda608d",
    "2024/trip to lisbon/IMG_0122.jpg": "b352022568c86df9a3b09f45d289073d00ad09ea273579cd9f394df5b902474a",
    "2024/trip to lisbon/IMG_0147.jpg": "2307ccf604dcfbf7dd5f01219f6a910d6760979f596196191558badd9cd2d518",
    "2024/trip to lisbon/IMG_0151.jpg": "7b2b71012ae2bb04e6302e4597c7dfc4adac3b69237fcaf42f0e46a5de0a32df",
    "2024/trip to lisbon/IMG_0180.jpg": "b51fba1536f7d09c9c5bf331a46ad28fb762847314c2b29b4edc53ff7adb8b5b",
    "2024/trip to lisbon/IMG_0184.jpg": "a3cd975faf83c86fee3a7eb8189b4d3fe42c5e5368d72dc15da2880971f86cb7",
    "inbox/IMG_0028.jpg": "f0d429ec80b89334b3a89a448241658ecf1647cb45e050f600ff629b199a9766",
    "inbox/IMG_0072.jpg": "974bbf802a47579df9c0eba6eed5577414fde89d79dede77d05527ede38ae074",
    "inbox/IMG_0176.jpg": "5d01b0a2bd9b4395272765ba3f6a1316c1eee43088756e95e485861216280385",
    "inbox/empty.dat": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "inbox/note.txt": "c95d2e07c8facd2a5c61ac68d94cd53f467cfb34e2f982a6c17ec3b96839d82e",
    "inbox/phone backup/IMG_0027.jpg": "d231c461be31388fb1714066a960502a902bebec0a632870a8e56f03714c1aa0",
    "inbox/phone backup/IMG_0039.jpg": "bfb90ac2776453fce0fc3efeee80c8601211590c693146e1652e2f6f6b0b6220",
    "inbox/phone backup/IMG_0042.jpg": "e3c92db98f2320340c7a91ce8ffc31a1d763284fb336d56d3fc72c216a250894",
    "misc/IMG_0091.jpg": "252b873336fbe2d6dee415a1c60069cc4f0f63443eafcbbfda6c97fbc5b2d39b",
    "misc/IMG_0173.jpg": "9ce3cb7959e86d25d86dd79247a8fdc7de36aaca19937209bf529892fc3ed468",
    "misc/note.txt": "c91b97ac70382a49f73af9019f459715b3fe03f446ede62789398bb0c1a43a6d",
    "old/exports/IMG_0008.jpg": "5e791135b49435e69dc32f161e090ea560bd6be53ceed5d440221f140104304b",
    "old/exports/IMG_0039.jpg": "bf2b6feadaf3e9bd1e92cde78eb9b824fe2122c4f8b1bc39d1843cd72d02381c",
    "old/exports/IMG_0044.jpg": "4c316f7f1ec11073f512f20a5906428f26647338333b60d20bc7386cc70f1670",
    "old/exports/IMG_0086.jpg": "7c64105aa3a37a8b419352421d5dc92696c4da6f9efdc048f58478c8dd6b3eb5",
    "old/exports/IMG_0127.jpg": "c321c70e8dc39772597895ab91ee0f760030abccceb614f87836cdc938921eab",
}
EXPECTED_REMOVED = [
    "2023/winter/IMG_0181.jpg",
    "2024/family/IMG_0052.jpg",
    "2024/family/IMG_0139.jpg",
    "2024/family/IMG_0153.jpg",
    "2024/trip to lisbon/IMG_0042.jpg",
    "2024/trip to lisbon/IMG_0072.jpg",
    "2024/trip to lisbon/IMG_0165.jpg",
    "inbox/IMG_0003.jpg",
    "inbox/IMG_0021.jpg",
    "inbox/IMG_0026.jpg",
    "inbox/IMG_0050.jpg",
    "inbox/IMG_0074.jpg",
    "inbox/IMG_0090.jpg",
    "inbox/IMG_0096.jpg",
    "inbox/IMG_0114.jpg",
    "inbox/IMG_0138.jpg",
    "inbox/IMG_0189.jpg",
    "inbox/phone backup/IMG_0060.jpg",
    "inbox/phone backup/IMG_0089.jpg",
    "inbox/phone backup/IMG_0130.jpg",
    "inbox/phone backup/IMG_0135.jpg",
    "inbox/phone backup/IMG_0173.jpg",
    "misc/IMG_0021.jpg",
    "misc/IMG_0034.jpg",
    "misc/IMG_0155.jpg",
    "misc/IMG_0187.jpg",
    "misc/IMG_0188.jpg",
    "misc/IMG_0199.jpg",
    "misc/empty.dat",
    "old/exports/IMG_0024.jpg",
    "old/exports/IMG_0087.jpg",
    "old/exports/IMG_0097.jpg",
    "old/exports/IMG_0130.jpg",
    "old/exports/IMG_0171.jpg",
    "old/exports/dup_only/export_0.jpg",
    "old/exports/dup_only/export_1.jpg",
    "old/exports/dup_only/export_2.jpg",
]


def _files():
    return {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() or p.is_symlink()}


def test_removed_list():
    assert REMOVED.is_file(), "missing /app/removed.txt"
    text = REMOVED.read_text()
    assert text.endswith("\n")
    assert text.splitlines() == EXPECTED_REMOVED


def test_kept_files_exact():
    assert _files() == set(EXPECTED_KEPT)


def test_kept_content_unchanged():
    for rel, digest in EXPECTED_KEPT.items():
        p = ROOT / rel
        assert p.is_file() and not p.is_symlink(), rel
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest, rel


def test_no_duplicates_left():
    digests = [hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in _files()]
    assert len(digests) == len(set(digests))


def test_no_empty_directories():
    assert ROOT.is_dir()
    empty = [str(d) for d in ROOT.rglob("*") if d.is_dir() and not any(d.iterdir())]
    assert empty == []
    assert not (ROOT / "old/exports/dup_only").exists()
