"""`turbine run` and the server drive one generation loop (tb_gen,
src/runtime/generate.c): for the same prompt, sampling and stop strings they
must give the same text. The CLI prints the prompt, the text and a newline;
the server returns the text alone, with the prompt's token count in usage, so
the CLI's -n (tokens in all, prompt included) is set to give as many tokens
as max_tokens. Run by tests/test_generate_cli_serve.sh."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BIN, Server, build_stories, check, ok, run_tests, workdir  # noqa: E402

PROMPT = "Once upon a time"
ENGINE = None
S = None


def cli_text(n_total, extra):
    r = subprocess.run([BIN, "run", ENGINE, "-p", PROMPT, "-n", str(n_total), "--threads", "1"] + extra,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(r.returncode == 0, "turbine run failed: %r" % r.stderr[-400:])
    out = r.stdout.decode("utf-8", errors="replace")
    check(out.startswith(PROMPT) and out.endswith("\n"), "turbine run output %r is not prompt + text + newline" % out[:80])
    return out[len(PROMPT):-1]


def compare(max_tokens, stops=None, temperature=0.0, seed=None):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": temperature}
    extra = ["--temperature", str(temperature)]
    if stops:
        body["stop"] = stops
        extra += ["--stop"] + stops
    if seed is not None:
        body["seed"] = seed
        extra += ["--seed", str(seed)]
    j = S.completion(body)
    text, finish = j["choices"][0]["text"], j["choices"][0]["finish_reason"]
    n_prompt = j["usage"]["prompt_tokens"]
    # -n counts the prompt and the token the prefill picks: n_prompt + max_tokens - 1
    cli = cli_text(n_prompt + max_tokens - 1, extra)
    check(cli == text, "stop %r, temperature %s: turbine run gave %r, the server %r" % (stops, temperature, cli, text))
    return text, finish


def t_greedy():
    text, finish = compare(60)
    check(finish == "length" and len(text) > 40, "greedy text %r ended with %r" % (text, finish))
    ok("greedy, 60 tokens: the same %d characters" % len(text))


def t_stop_across_tokens():
    full, _ = compare(60)
    # stop strings from the middle of the text, starting and ending inside tokens
    for frac in (0.3, 0.5, 0.7):
        at = int(len(full) * frac)
        stop = full[at:at + 5]
        text, finish = compare(60, [stop])
        check(finish == "stop" and text == full[:full.find(stop)], "stop %r: text %r, finish %r" % (stop, text, finish))
    ok("greedy with stop strings inside tokens: the same text, cut before the stop")


def t_stop_never_matches():
    full, _ = compare(60)
    text, finish = compare(60, [full[10:14] + "\x01"])
    check(text == full and finish == "length", "a stop that never matches changed the text: %r" % text)
    ok("a held-back prefix of a stop string is released the same way")


def t_seeded():
    full, _ = compare(50, temperature=0.8, seed=5)
    check(len(full) > 40, "seeded text too short for the test: %r" % full)
    stop = full[len(full) // 2:len(full) // 2 + 4]
    text, finish = compare(50, [stop], temperature=0.8, seed=5)
    check(finish == "stop" and text == full[:full.find(stop)], "seeded, stop %r: text %r" % (stop, text))
    ok("seeded sampling, with and without a stop string: the same text (%d characters)" % len(full))


def main():
    global S, ENGINE
    ENGINE = build_stories(workdir("cli_same"))
    S = Server(ENGINE, "--threads", "1").start()
    run_tests([("greedy", t_greedy), ("stop across tokens", t_stop_across_tokens),
               ("stop never matches", t_stop_never_matches), ("seeded", t_seeded)])


if __name__ == "__main__":
    main()
