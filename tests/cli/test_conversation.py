"""Talking to a model: each turn is transformers' ``apply_chat_template`` of the whole history with
its generation prompt and the reply transformers' greedy ``generate`` makes from it (ids equal),
in process, through ``theseus.sample FOLDER --chat`` reading its messages from standard input,
and on a terminal (a pty): streamed, ``/reset``, ``/exit``, Ctrl-D and Ctrl-C."""

from __future__ import annotations

import builtins
import io
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from data.chat_folders import chatml_folder

from theseus.cli.conversation import Conversation, TextStream
from theseus.cli.sample import converse
from theseus.data.tokenizer import ByteTokenizer, escape_controls
from theseus.model.sampling import Sampling

SYSTEM = "You are terse."
# each message of a conversation, "/reset" starting over (the system message stays)
SCRIPT = ["Hello there!", "What is 2 plus 2, naïvely?", "/reset", "Tell me more."]
MAX_NEW = 10


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny random Llama with a ChatML tokenizer folder (end of turn: <|im_end|>, its eos)."""
    from interop.hf_models import llama_config, save_hf, transformers

    config = llama_config()
    config.vocab_size, config.max_position_embeddings = 400, 128
    return chatml_folder(save_hf(transformers.LlamaForCausalLM(config), tmp_path_factory.mktemp("chat") / "llama",
                                 tokenizer=False))


@pytest.fixture(scope="module")
def expected(folder) -> list[tuple[list[int], list[int], str]]:
    """transformers' ``(prompt ids, reply ids, reply text)`` of each message of SCRIPT: the history
    rendered by apply_chat_template, the reply greedy up to <|im_end|> (left out) or MAX_NEW tokens."""
    import torch
    from interop.hf_models import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns, history = [], [{"role": "system", "content": SYSTEM}]
    for message in SCRIPT:
        if message == "/reset":
            history = history[:1]
            continue
        history.append({"role": "user", "content": message})
        prompt = tokenizer.apply_chat_template(history, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=end, pad_token_id=end)
        reply = [token for token in out[0, len(prompt):].tolist() if token != end]
        text = tokenizer.decode(reply, skip_special_tokens=False)
        history.append({"role": "assistant", "content": text})
        turns.append((prompt, reply, text))
    return turns


@pytest.fixture(scope="module")
def chat(folder) -> Conversation:
    from theseus.cli.trained import load_trained

    return Conversation.of(load_trained(folder), system=SYSTEM, sampling=Sampling(0.0), max_new_tokens=MAX_NEW)


@pytest.mark.slow
def test_each_turn_renders_the_whole_history_and_replies_as_transformers(chat, expected):
    chat.reset()
    turns = iter(expected)
    streamed = []
    for message in SCRIPT:
        if message == "/reset":
            chat.reset()
            assert chat.messages == [{"role": "system", "content": SYSTEM}]
            continue
        prompt, reply, text = next(turns)
        assert chat.prompt(message).tolist() == prompt
        pieces = []
        assert chat.say(message, on_text=pieces.append) == (text, reply)
        assert "".join(pieces) == escape_controls(text)  # a control character the random model makes: shown as \\xNN
        streamed.append(len(pieces))
    # in pieces (a reply of unfinished characters alone, U+FFFD each, comes out whole at its end)
    assert max(streamed) > 1
    assert len(set(text for _, _, text in expected)) == 3  # three different replies


@pytest.mark.slow
def test_the_command_reads_a_conversation_from_standard_input(folder, expected):
    proc = subprocess.run([sys.executable, "-m", "theseus.sample", str(folder), "--chat", "--system", SYSTEM,
                           "--temperature", "0", "--max-new-tokens", str(MAX_NEW)], input="\n".join(SCRIPT) + "\n",
                          capture_output=True, text=True, cwd=folder.parent, env=_env(), timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout == "".join(escape_controls(text) + "\n" for _, _, text in expected)


@pytest.mark.slow
def test_on_a_terminal_replies_stream_after_a_prompt_and_ctrl_d_leaves(folder, expected):
    """A pty: the greeting names the commands, each message gets its reply after ``> ``;
    ``/reset`` starts over; Ctrl-D at the prompt leaves with 0."""
    controller, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "theseus.sample", str(folder), "--chat", "--system", SYSTEM,
                             "--temperature", "0", "--max-new-tokens", str(MAX_NEW)], stdin=terminal, stdout=terminal,
                            stderr=subprocess.PIPE, cwd=folder.parent, env=_env())
    os.close(terminal)
    try:
        screen = _prompted(controller, b"", 1)
        for turn, message in enumerate(SCRIPT, start=2):
            os.write(controller, message.encode() + b"\n")
            screen = _prompted(controller, screen, turn)
        os.write(controller, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        os.close(controller)
    stderr = proc.stderr.read().decode()
    assert "Traceback" not in stderr and "/reset starts over, /exit (or Ctrl-D) leaves" in stderr
    replies = [escape_controls(text) for _, _, text in expected]
    transcript = screen.decode().replace("\r\n", "\n")
    for message, reply in zip([m for m in SCRIPT if m != "/reset"], replies):
        assert f"> {message}\n{reply}\n" in transcript


@pytest.mark.slow
def test_ctrl_c_leaves_without_a_traceback_and_exit_leaves(chat, monkeypatch):
    """The terminal loop in process: Ctrl-C at the prompt or during a reply returns 130 (a shell's
    SIGINT code), ``/exit`` 0 before the rest is read."""
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def typed(*lines):
        it = iter(lines)

        def read(prompt=""):
            line = next(it)
            if isinstance(line, BaseException):
                raise line
            return line
        return read

    out = Terminal()
    monkeypatch.setattr(builtins, "input", typed(KeyboardInterrupt()))
    assert converse(chat, Terminal(), out, "model") == 130 and out.getvalue() == "\n"
    monkeypatch.setattr(builtins, "input", typed("/exit", "never read"))
    assert converse(chat, Terminal(), Terminal(), "model") == 0
    monkeypatch.setattr(chat, "say", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(builtins, "input", typed("hello"))
    assert converse(chat, Terminal(), Terminal(), "model") == 130


def test_streamed_text_is_whole_characters():
    """Byte by byte, a multi-byte character comes out whole, once its last byte is in."""
    text = "naïve ✓ 東京 😀!"
    tokenizer = ByteTokenizer()
    stream = TextStream(tokenizer)
    pieces = [stream.add([byte]) for byte in tokenizer.encode(text)]
    assert "".join(pieces) + stream.close() == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert pieces[-2:] == ["😀", "!"] and pieces[-3:-2] == [""]  # the emoji's 4 bytes: 3 held back


def test_streamed_text_shows_what_a_terminal_would_act_on_or_cannot_show():
    """A byte model's NUL, an escape sequence, a carriage return and bytes that are no character's come
    out as visible ``\\xNN``; tab and newline as they are; a character cut off at the end as its bytes."""
    tokenizer = ByteTokenizer()
    stream = TextStream(tokenizer)
    ids = [*b"a\x00\x1b[2J\r\tb\n", 0xFF, *b"c", 0xE2, 0x82, *"€".encode(), 0xC3, 256, 0xE2, 0x82]
    pieces = [stream.add([byte]) for byte in ids]
    shown = "".join(pieces) + stream.close()
    assert shown == "a\\x00\\x1b[2J\\x0d\tb\n\\xffc\\xe2\\x82€\\xc3<|endoftext|>\\xe2\\x82"
    assert tokenizer.decode(ids) == "a\x00\x1b[2J\r\tb\n\ufffdc\ufffd€\ufffd<|endoftext|>\ufffd"  # what a reply holds
    assert pieces[-2:] == ["", ""]  # the cut-off character: held back until the end


def _env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _prompted(fd: int, screen: bytes, prompts: int, timeout: float = 300) -> bytes:
    """``screen`` with what the pty at ``fd`` prints until it has shown ``prompts`` prompts (bytes:
    a read may end inside a character, the terminal echoing a typed one byte by byte)."""
    deadline = time.monotonic() + timeout
    while not (screen.count(b"> ") >= prompts and screen.endswith(b"> ")):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no prompt {prompts} after {timeout} s; the terminal shows {screen[-500:]!r}")
        screen += os.read(fd, 4096)
    return screen
