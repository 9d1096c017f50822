/*
 * health_server.c — a minimal single-threaded epoll HTTP/1.1 server for the
 * load-tester comparison: every request (GET, no body) gets "200 ok" on a
 * kept-alive connection. Binds 127.0.0.1 on an ephemeral port, writes the
 * port to argv[1], and exits after argv[2] seconds (default 60).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
static char *inbuf[MAX_FD];
static int inlen[MAX_FD];
static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int life = argc > 2 ? atoi(argv[2]) : 60;
    alarm(life > 0 && life < 3600 ? (unsigned)life : 60);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096) || getsockname(ls, (struct sockaddr *)&a, &al)) return 1;
    FILE *f = fopen(argv[1], "w");
    if (!f) return 1;
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static char out[65536];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (c >= MAX_FD) { close(c); continue; }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (!inbuf[c]) inbuf[c] = malloc(8192);
                    inlen[c] = 0;
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            int r = (int)read(fd, inbuf[fd] + inlen[fd], 8192 - inlen[fd]);
            if (r <= 0) { if (r < 0 && errno == EAGAIN) continue; close(fd); inlen[fd] = 0; continue; }
            inlen[fd] += r;
            int k = 0, start = 0, reqs = 0;
            for (; k + 3 < inlen[fd]; k++)
                if (!memcmp(inbuf[fd] + k, "\r\n\r\n", 4)) { reqs++; start = k + 4; k += 3; }
            memmove(inbuf[fd], inbuf[fd] + start, inlen[fd] - start);
            inlen[fd] -= start;
            if (inlen[fd] >= 8192) { close(fd); inlen[fd] = 0; continue; }
            int o = 0;
            for (int q = 0; q < reqs; q++) {
                if (o + (int)sizeof resp > (int)sizeof out) { if (write(fd, out, o) < 0) break; o = 0; }
                memcpy(out + o, resp, sizeof resp - 1);
                o += sizeof resp - 1;
            }
            if (o && write(fd, out, o) < 0) { close(fd); inlen[fd] = 0; }
        }
    }
}
