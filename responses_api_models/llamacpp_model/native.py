"""llama.cpp's C API through ctypes, from the prebuilt library inside the ``xllamacpp`` wheel.

Why not llama-cpp-python: it ships only as source on PyPI and compiles llama.cpp on install, which takes hours on a
small shared CPU; ``xllamacpp`` ships manylinux wheels whose one shared library exports llama.cpp's whole C API
(``llama_*``), so the embedded model installs in seconds. The engine needs only a few dozen calls, declared here
against the ``llama.h`` of the pinned ``xllamacpp`` release (structs passed by value must match it field for field:
change the pin, re-check the structs below).

:class:`LlamaModel` is the small, single-threaded surface the engine drives: tokenize, detokenize, evaluate with a
prefix-reusing KV cache, read logits, and sample (optionally under a GBNF grammar).
"""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
from collections.abc import Generator
from typing import Any

__all__ = ["NATIVE_DISTRIBUTION", "LlamaModel", "NativeLibraryError", "load_library"]

NATIVE_DISTRIBUTION = "xllamacpp"

_token = ctypes.c_int32
_pos = ctypes.c_int32
_seq_id = ctypes.c_int32
_p = ctypes.c_void_p


class NativeLibraryError(RuntimeError):
    """The llama.cpp library is missing or refused a model, context or grammar."""


class _ModelParams(ctypes.Structure):
    _fields_ = [
        ("devices", _p),
        ("tensor_buft_overrides", _p),
        ("n_gpu_layers", ctypes.c_int32),
        ("split_mode", ctypes.c_int),
        ("load_mode", ctypes.c_int),
        ("lazy_mode", ctypes.c_int),
        ("main_gpu", ctypes.c_int32),
        ("tensor_split", _p),
        ("progress_callback", _p),
        ("progress_callback_user_data", _p),
        ("kv_overrides", _p),
        ("vocab_only", ctypes.c_bool),
        ("check_tensors", ctypes.c_bool),
        ("use_extra_bufts", ctypes.c_bool),
        ("no_host", ctypes.c_bool),
        ("no_alloc", ctypes.c_bool),
        ("load_mtp", ctypes.c_bool),
    ]


class _ContextParams(ctypes.Structure):
    _fields_ = [
        ("n_ctx", ctypes.c_uint32),
        ("n_batch", ctypes.c_uint32),
        ("n_ubatch", ctypes.c_uint32),
        ("n_seq_max", ctypes.c_uint32),
        ("n_rs_seq", ctypes.c_uint32),
        ("n_outputs_max", ctypes.c_uint32),
        ("n_outputs_max_per_seq", ctypes.c_uint32),
        ("n_threads", ctypes.c_int32),
        ("n_threads_batch", ctypes.c_int32),
        ("ctx_type", ctypes.c_int),
        ("rope_scaling_type", ctypes.c_int),
        ("pooling_type", ctypes.c_int),
        ("attention_type", ctypes.c_int),
        ("flash_attn_type", ctypes.c_int),
        ("rope_freq_base", ctypes.c_float),
        ("rope_freq_scale", ctypes.c_float),
        ("yarn_ext_factor", ctypes.c_float),
        ("yarn_attn_factor", ctypes.c_float),
        ("yarn_beta_fast", ctypes.c_float),
        ("yarn_beta_slow", ctypes.c_float),
        ("yarn_orig_ctx", ctypes.c_uint32),
        ("defrag_thold", ctypes.c_float),
        ("cb_eval", _p),
        ("cb_eval_user_data", _p),
        ("type_k", ctypes.c_int),
        ("type_v", ctypes.c_int),
        ("moe_cache_size", ctypes.c_size_t),
        ("abort_callback", _p),
        ("abort_callback_data", _p),
        ("embeddings", ctypes.c_bool),
        ("offload_kqv", ctypes.c_bool),
        ("no_perf", ctypes.c_bool),
        ("op_offload", ctypes.c_bool),
        ("swa_full", ctypes.c_bool),
        ("kv_unified", ctypes.c_bool),
        ("samplers", _p),
        ("n_samplers", ctypes.c_size_t),
        ("ctx_other", _p),
    ]


class _Batch(ctypes.Structure):
    _fields_ = [
        ("n_tokens", ctypes.c_int32),
        ("token", ctypes.POINTER(_token)),
        ("embd", ctypes.POINTER(ctypes.c_float)),
        ("pos", ctypes.POINTER(_pos)),
        ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
        ("seq_id", ctypes.POINTER(ctypes.POINTER(_seq_id))),
        ("logits", ctypes.POINTER(ctypes.c_int8)),
    ]


class _SamplerChainParams(ctypes.Structure):
    _fields_ = [("no_perf", ctypes.c_bool)]


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

# name: (restype, argtypes)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "llama_backend_init": (None, []),
    "llama_log_set": (None, [_LOG_CALLBACK, _p]),
    "llama_model_default_params": (_ModelParams, []),
    "llama_model_load_from_file": (_p, [ctypes.c_char_p, _ModelParams]),
    "llama_model_free": (None, [_p]),
    "llama_model_get_vocab": (_p, [_p]),
    "llama_model_meta_val_str": (ctypes.c_int32, [_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "llama_context_default_params": (_ContextParams, []),
    "llama_init_from_model": (_p, [_p, _ContextParams]),
    "llama_free": (None, [_p]),
    "llama_n_ctx": (ctypes.c_uint32, [_p]),
    "llama_get_memory": (_p, [_p]),
    "llama_memory_seq_rm": (ctypes.c_bool, [_p, _seq_id, _pos, _pos]),
    "llama_vocab_n_tokens": (ctypes.c_int32, [_p]),
    "llama_vocab_bos": (_token, [_p]),
    "llama_vocab_eos": (_token, [_p]),
    "llama_vocab_get_add_bos": (ctypes.c_bool, [_p]),
    "llama_vocab_is_eog": (ctypes.c_bool, [_p, _token]),
    "llama_tokenize": (
        ctypes.c_int32,
        [_p, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(_token), ctypes.c_int32, ctypes.c_bool, ctypes.c_bool],
    ),
    "llama_token_to_piece": (
        ctypes.c_int32,
        [_p, _token, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool],
    ),
    "llama_batch_init": (_Batch, [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    "llama_batch_free": (None, [_Batch]),
    "llama_decode": (ctypes.c_int32, [_p, _Batch]),
    "llama_get_logits_ith": (ctypes.POINTER(ctypes.c_float), [_p, ctypes.c_int32]),
    "llama_sampler_chain_default_params": (_SamplerChainParams, []),
    "llama_sampler_chain_init": (_p, [_SamplerChainParams]),
    "llama_sampler_chain_add": (None, [_p, _p]),
    "llama_sampler_init_greedy": (_p, []),
    "llama_sampler_init_dist": (_p, [ctypes.c_uint32]),
    "llama_sampler_init_temp": (_p, [ctypes.c_float]),
    "llama_sampler_init_top_p": (_p, [ctypes.c_float, ctypes.c_size_t]),
    "llama_sampler_init_grammar": (_p, [_p, ctypes.c_char_p, ctypes.c_char_p]),
    "llama_sampler_sample": (_token, [_p, _p, ctypes.c_int32]),
    "llama_sampler_free": (None, [_p]),
}

_library: ctypes.CDLL | None = None


@_LOG_CALLBACK
def _quiet_log(level: int, text: bytes | None, user_data: Any) -> None:
    """llama.cpp logs every load step to stderr; the server has its own logging."""


def _library_path() -> pathlib.Path:
    spec = importlib.util.find_spec(NATIVE_DISTRIBUTION)
    for location in list(spec.submodule_search_locations or []) if spec is not None else []:
        for candidate in sorted(pathlib.Path(location).glob(f"{NATIVE_DISTRIBUTION}*.so")):
            return candidate
    raise NativeLibraryError(
        f"llama.cpp's library not found: install the '{NATIVE_DISTRIBUTION}' package "
        f"(pip install 'nemo-gym[embedded]') for the embedded model"
    )


def load_library(verbose: bool = False) -> ctypes.CDLL:
    """Open the library once per process and declare the calls the engine makes."""
    global _library
    if _library is None:
        library = ctypes.CDLL(str(_library_path()))
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(library, name)
            function.restype = restype
            function.argtypes = argtypes
        library.llama_backend_init()
        _library = library
    if not verbose:
        _library.llama_log_set(_quiet_log, None)
    return _library


class LlamaModel:
    """One GGUF model with one context: a token sequence mirrored in the KV cache, plus sampling on its logits.

    Not thread-safe (llama.cpp contexts are not); the engine serializes every call.
    """

    def __init__(self, model_path: str, n_ctx: int, n_threads: int, verbose: bool = False) -> None:
        self._lib = lib = load_library(verbose)
        self._model = lib.llama_model_load_from_file(model_path.encode(), lib.llama_model_default_params())
        if not self._model:
            raise NativeLibraryError(f"llama.cpp could not load the model {model_path}")
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = min(n_ctx, 512)
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise NativeLibraryError(f"llama.cpp could not create a {n_ctx}-token context for {model_path}")
        self.vocab = lib.llama_model_get_vocab(self._model)
        self.n_ctx = int(lib.llama_n_ctx(self._ctx))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_batch = int(params.n_batch)
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._memory = lib.llama_get_memory(self._ctx)
        self.tokens: list[int] = []  # what the KV cache holds, in order
        self._piece = ctypes.create_string_buffer(256)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        self.close()

    # -- vocabulary -------------------------------------------------------------------------------------------------

    @property
    def bos(self) -> int:
        return int(self._lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(self._lib.llama_vocab_eos(self.vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self.vocab, token))

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text (the chat template, say); None when the model has no such key."""
        size = 4096
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = self._lib.llama_model_meta_val_str(self._model, key.encode(), buffer, size)
            if length < 0:
                return None
            if length < size:
                return buffer.raw[:length].decode("utf-8", errors="replace")
            size = length + 1

    def tokenize(self, text: bytes, special: bool) -> list[int]:
        """Token ids of ``text`` without BOS; ``special`` parses control-token markup (our own scaffolding only)."""
        capacity = len(text) + 8
        while True:
            out = (_token * capacity)()
            count = self._lib.llama_tokenize(self.vocab, text, len(text), out, capacity, False, special)
            if count >= 0:
                return list(out[:count])
            capacity = -count

    def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        pieces = []
        for token in tokens:
            length = self._lib.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
            if length < 0:  # a piece longer than the buffer: never for real vocabularies, but stay correct
                bigger = ctypes.create_string_buffer(-length)
                length = self._lib.llama_token_to_piece(self.vocab, token, bigger, -length, 0, special)
                pieces.append(bigger.raw[:length])
            else:
                pieces.append(self._piece.raw[:length])
        return b"".join(pieces)

    # -- evaluation -------------------------------------------------------------------------------------------------

    def truncate(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens (KV cache included)."""
        if length < len(self.tokens):
            self._lib.llama_memory_seq_rm(self._memory, -1, length, -1)
            del self.tokens[length:]

    def evaluate(self, tokens: list[int], all_logits: bool = False) -> None:
        """Append ``tokens`` to the sequence; logits for the last one, or for each of them with ``all_logits``.

        With ``all_logits`` the tokens must fit one batch, so that row ``i`` of :meth:`logits` is after token ``i``.
        """
        if all_logits and len(tokens) > self.n_batch:
            raise ValueError(f"at most {self.n_batch} tokens can be scored in one batch")
        batch = self._batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            last_chunk = start + self.n_batch >= len(tokens)
            base = len(self.tokens)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = base + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = int(all_logits or (last_chunk and i == len(chunk) - 1))
            batch.n_tokens = len(chunk)
            status = self._lib.llama_decode(self._ctx, batch)
            if status != 0:
                raise NativeLibraryError(f"llama_decode failed with status {status}")
            self.tokens += chunk

    def logits(self, row: int = -1) -> Any:
        """A pointer to ``n_vocab`` floats: the raw next-token logits at an evaluated output row (-1: the last)."""
        return self._lib.llama_get_logits_ith(self._ctx, row)

    # -- sampling ---------------------------------------------------------------------------------------------------

    def check_grammar(self, grammar: str) -> bool:
        """Whether llama.cpp's GBNF parser accepts ``grammar`` (a rejected grammar must never reach sampling)."""
        sampler = self._lib.llama_sampler_init_grammar(self.vocab, grammar.encode("utf-8"), b"root")
        if sampler:
            self._lib.llama_sampler_free(sampler)
        return bool(sampler)

    def sample(
        self, temperature: float, top_p: float, seed: int, grammar: str | None = None
    ) -> Generator[int, None, None]:
        """Draw tokens continuing the sequence, one at a time, until the caller stops.

        Each token is yielded before it is evaluated, so while the caller looks at it, :meth:`logits` still shows
        the distribution it was drawn from. Sampling is plain OpenAI semantics: grammar, then top-p, then
        temperature (0 is greedy), nothing else.
        """
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        try:
            if grammar is not None:
                grammar_sampler = lib.llama_sampler_init_grammar(self.vocab, grammar.encode("utf-8"), b"root")
                if not grammar_sampler:
                    raise NativeLibraryError("llama.cpp rejected the grammar")
                lib.llama_sampler_chain_add(chain, grammar_sampler)
            if temperature <= 0.0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
            else:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(top_p, 1))
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(temperature))
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
            while True:
                token = int(lib.llama_sampler_sample(chain, self._ctx, -1))
                yield token
                self.evaluate([token])
        finally:
            lib.llama_sampler_free(chain)
