"""--host takes a name (localhost) or an IPv6 address as well as an IPv4 one:
the server resolves it, listens on the first address that binds, prints the
URL as a browser spells it ([::1]:PORT) and answers /health there.
Run by tests/test_serve_host.sh."""
import http.client
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BIN, _die_with_parent, build_stories, check, ok, run_tests, workdir  # noqa: E402

ENGINE = None
D = None


def free_port(family, addr):
    s = socket.socket(family)
    s.bind((addr, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def health(addr, port):
    c = http.client.HTTPConnection(addr, port, timeout=2)
    try:
        c.request("GET", "/health")
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def serve(host, family, probe_addr, want_url):
    """Starts `turbine serve --host host` and checks /health over probe_addr and the printed URL."""
    for _attempt in range(5):  # a port taken between probe and bind: another
        port = free_port(family, probe_addr)
        log = os.path.join(D, "host_%s.log" % host.replace(":", "_"))
        with open(log, "wb") as lf:
            p = subprocess.Popen([BIN, "serve", ENGINE, "--host", host, "--port", str(port), "--threads", "1"],
                                 stdout=lf, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        try:
            st = None
            deadline = time.time() + 30
            while time.time() < deadline and p.poll() is None:
                try:
                    st, body = health(probe_addr, port)
                    if st == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            text = open(log, "rb").read().decode(errors="replace")
            if p.poll() is not None and "cannot listen" in text and "Address already in use" in text:
                continue
            check(st == 200, "--host %s: /health over %s:%d -> %s; log:\n%s" % (host, probe_addr, port, st, text))
            url = want_url % port
            check(url in text, "--host %s: the log does not print %s:\n%s" % (host, url, text))
            return port, p
        except BaseException:
            p.kill()
            p.wait(timeout=10)
            raise
    check(False, "--host %s: no free port after 5 tries" % host)


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)


def t_ipv6_loopback():
    port, p = serve("::1", socket.AF_INET6, "::1", "http://[::1]:%d")
    stop(p)
    ok("--host ::1: /health over [::1], prints http://[::1]:%d" % port)


def t_localhost():
    addrs = {a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}
    probe = "::1" if "127.0.0.1" not in addrs else "127.0.0.1"
    port, p = serve("localhost", socket.AF_INET6 if probe == "::1" else socket.AF_INET, probe, "http://localhost:%d")
    try:
        st, _ = health("localhost", port)
        check(st == 200, "--host localhost: /health via the name -> %s" % st)
    finally:
        stop(p)
    ok("--host localhost (%s): /health answers, prints http://localhost:%d" % (", ".join(sorted(addrs)), port))


def t_ipv6_any():
    port, p = serve("::", socket.AF_INET6, "::1", "http://[::]:%d")
    stop(p)
    ok("--host ::: /health over [::1], prints http://[::]:%d" % port)


def t_bad_host():
    r = subprocess.run([BIN, "serve", ENGINE, "--host", "no-such-host.invalid", "--port", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = r.stdout.decode(errors="replace")
    check(r.returncode == 1 and "no-such-host.invalid" in out and "resolve" in out, "an unknown host: rc %d %r" % (r.returncode, out))
    ok("an unresolvable --host: exit 1 naming it")


def main():
    global ENGINE, D
    D = workdir("host")
    ENGINE = build_stories(D)
    run_tests([("IPv6 loopback", t_ipv6_loopback), ("localhost", t_localhost), ("IPv6 any", t_ipv6_any),
               ("unresolvable host", t_bad_host)])


if __name__ == "__main__":
    main()
