"""Fenced-block extraction shared by the code and structured-output verifiers."""

from __future__ import annotations

from nemo_gym.verifiers.code_blocks import fenced_blocks, last_fenced_block

REPLY = """Draft:
```python
print(1)
```
Better, with a note in C first:
```cpp
int main() {}
```
```Python3 title="final"
print(2)
```
"""


def test_blocks_keep_order_language_and_body():
    blocks = fenced_blocks(REPLY)
    assert [b.language for b in blocks] == ["python", "cpp", "python3"]
    assert blocks[0].content == "print(1)\n"


def test_last_block_in_a_language():
    assert last_fenced_block(REPLY, {"python", "python3"}) == "print(2)\n"
    assert last_fenced_block(REPLY, {"cpp"}) == "int main() {}\n"
    assert last_fenced_block(REPLY, {"rust"}) is None
    assert last_fenced_block(REPLY) == "print(2)\n"


def test_untagged_blocks_tildes_and_unclosed_fences():
    assert last_fenced_block("```\nx = 1\n```", {"python"}) == "x = 1\n"
    assert last_fenced_block("```\nx = 1\n```", {"python"}, allow_untagged=False) is None
    assert last_fenced_block("~~~json\n{}\n~~~", {"json"}) == "{}\n"
    assert last_fenced_block("```python\nprint('cut off", {"python"}) is None
    assert last_fenced_block("````python\n```inner```\n````", {"python"}) == "```inner```\n"
