"""The official `openai` npm client (tests/serve/node_modules, from `npm ci`)
against `turbine serve` with an API key. Run by tests/test_serve_openai_client.sh."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, run_tests, workdir  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def t_node_client():
    node = shutil.which("node")
    check(node is not None, "node not found (scripts/setup.sh installs nodejs with TURBINE_TEST_DEPS=1)")
    check(os.path.isdir(os.path.join(HERE, "node_modules", "openai")),
          "tests/serve/node_modules/openai is missing: run `npm ci` in tests/serve")
    s = Server(build_stories(workdir("openai")), api_key="sk-turbine-test").start()
    r = subprocess.run([node, os.path.join(HERE, "openai_client.mjs"), str(s.port), s.api_key], cwd=HERE,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = r.stdout.decode(errors="replace")
    print(out.rstrip(), flush=True)
    check(r.returncode == 0, "the openai client script failed (rc %d)" % r.returncode)
    check(s.alive(), "the server died:\n" + s.log())


if __name__ == "__main__":
    run_tests([("openai npm client", t_node_client)])
