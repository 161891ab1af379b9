/*
 * ksmc-echo: a small echo server/client over the kernel's own SMC (AF_SMC),
 * for the soft-RoCE test bed's two-ksmc mode (run.sh compiles it with the
 * host's gcc). Also sets a user EID over the SMC generic-netlink family, as
 * `smcd ueid add` of smc-tools does (not packaged for Debian 12).
 *
 *   ksmc-echo ueid UEID                    add UEID (upper case, <= 32 chars)
 *   ksmc-echo server PORT CONNS            AF_SMC listener, echoes CONNS
 *                                          connections one after another
 *                                          (plain TCP clients fall back)
 *   ksmc-echo stream smc|tcp IP PORT BYTES echo BYTES, print MB/s each way
 *   ksmc-echo rr smc|tcp IP PORT SIZE N    N round trips of SIZE bytes
 *
 * Clients retry their connect (refused) for up to 60 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <linux/smc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif
#define SMCPROTO_SMC 0
#define EID_LEN 32

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "ksmc-echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* ---- generic netlink: resolve the SMC family, add a UEID ---- */

struct nlreq {
	struct nlmsghdr n;
	struct genlmsghdr g;
	char buf[256];
};

static void add_attr(struct nlreq *r, int type, const void *data, int len)
{
	struct nlattr *a = (struct nlattr *)((char *)r + NLMSG_ALIGN(r->n.nlmsg_len));
	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	r->n.nlmsg_len = NLMSG_ALIGN(r->n.nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static int nl_talk(int fd, struct nlreq *r, char *ans, int anslen)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (sendto(fd, r, r->n.nlmsg_len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("netlink send");
	int n = recv(fd, ans, anslen, 0);
	if (n < 0)
		die("netlink recv");
	struct nlmsghdr *h = (struct nlmsghdr *)ans;
	if (h->nlmsg_type == NLMSG_ERROR) {
		struct nlmsgerr *e = NLMSG_DATA(h);
		return e->error;
	}
	return n;
}

static int cmd_ueid(const char *ueid)
{
	char ans[4096];
	struct nlreq r;
	int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_GENERIC);
	if (fd < 0)
		die("netlink socket");

	memset(&r, 0, sizeof(r));
	r.n.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r.n.nlmsg_type = GENL_ID_CTRL;
	r.n.nlmsg_flags = NLM_F_REQUEST;
	r.n.nlmsg_seq = 1;
	r.g.cmd = CTRL_CMD_GETFAMILY;
	r.g.version = 1;
	add_attr(&r, CTRL_ATTR_FAMILY_NAME, SMC_GENL_FAMILY_NAME, strlen(SMC_GENL_FAMILY_NAME) + 1);
	int n = nl_talk(fd, &r, ans, sizeof(ans));
	if (n < 0) {
		fprintf(stderr, "ksmc-echo: no %s family (smc module loaded?): %s\n",
			SMC_GENL_FAMILY_NAME, strerror(-n));
		return 1;
	}
	int family = -1;
	struct nlmsghdr *h = (struct nlmsghdr *)ans;
	struct nlattr *a = (struct nlattr *)((char *)NLMSG_DATA(h) + GENL_HDRLEN);
	int left = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
	while (left >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= left) {
		if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_ID)
			family = *(unsigned short *)((char *)a + NLA_HDRLEN);
		left -= NLA_ALIGN(a->nla_len);
		a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len));
	}
	if (family < 0) {
		fprintf(stderr, "ksmc-echo: no family id in the answer\n");
		return 1;
	}

	/* The kernel wants exactly 32 characters, blank-padded, plus NUL. */
	char eid[EID_LEN + 1];
	memset(eid, ' ', EID_LEN);
	eid[EID_LEN] = 0;
	memcpy(eid, ueid, strlen(ueid) > EID_LEN ? EID_LEN : strlen(ueid));

	memset(&r, 0, sizeof(r));
	r.n.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r.n.nlmsg_type = family;
	r.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	r.n.nlmsg_seq = 2;
	r.g.cmd = SMC_NETLINK_ADD_UEID;
	r.g.version = SMC_GENL_FAMILY_VERSION;
	add_attr(&r, SMC_NLA_EID_TABLE_ENTRY, eid, EID_LEN + 1);
	n = nl_talk(fd, &r, ans, sizeof(ans));
	if (n < 0 && n != -EEXIST) {
		fprintf(stderr, "ksmc-echo: add UEID '%s': %s\n", ueid, strerror(-n));
		return 1;
	}
	printf("ksmc-echo: UEID '%s' set\n", ueid);
	close(fd);
	return 0;
}

/* ---- sockets ---- */

static void write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			die("write");
		}
		p += w;
		n -= w;
	}
}

static void read_all(int fd, char *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (r == 0) {
			fprintf(stderr, "ksmc-echo: unexpected EOF\n");
			exit(1);
		}
		p += r;
		n -= r;
	}
}

static int open_sock(const char *proto)
{
	int fd;
	if (strcmp(proto, "smc") == 0)
		fd = socket(AF_SMC, SOCK_STREAM, SMCPROTO_SMC);
	else
		fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	return fd;
}

static int connect_retry(const char *proto, const char *ip, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
		fprintf(stderr, "ksmc-echo: bad address %s\n", ip);
		exit(2);
	}
	double deadline = now() + 60;
	for (;;) {
		int fd = open_sock(proto);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return fd;
		}
		if ((errno != ECONNREFUSED && errno != EHOSTUNREACH && errno != ENETUNREACH) ||
		    now() > deadline)
			die("connect");
		close(fd);
		usleep(500000);
	}
}

static int cmd_server(int port, int conns)
{
	int fd = open_sock("smc");
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind");
	if (listen(fd, 16) < 0)
		die("listen");
	printf("ksmc-echo: listening on port %d for %d connection(s)\n", port, conns);
	fflush(stdout);
	static char buf[1 << 16];
	for (int i = 0; i < conns; i++) {
		int c = accept(fd, NULL, NULL);
		if (c < 0)
			die("accept");
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		unsigned long long total = 0;
		for (;;) {
			ssize_t r = read(c, buf, sizeof(buf));
			if (r < 0) {
				if (errno == EINTR)
					continue;
				die("read");
			}
			if (r == 0)
				break;
			write_all(c, buf, r);
			total += r;
		}
		printf("ksmc-echo: connection %d: echoed %llu bytes\n", i + 1, total);
		fflush(stdout);
		close(c);
	}
	return 0;
}

struct writer {
	int fd;
	size_t bytes;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	static char buf[1 << 16];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (char)i;
	size_t left = w->bytes;
	while (left > 0) {
		size_t n = left < sizeof(buf) ? left : sizeof(buf);
		write_all(w->fd, buf, n);
		left -= n;
	}
	return NULL;
}

static int cmd_stream(const char *proto, const char *ip, int port, size_t bytes)
{
	int fd = connect_retry(proto, ip, port);
	struct writer w = { fd, bytes };
	pthread_t t;
	static char buf[1 << 16];
	double t0 = now();
	if (pthread_create(&t, NULL, writer_main, &w) != 0)
		die("pthread_create");
	size_t left = bytes, off = 0;
	while (left > 0) {
		ssize_t r = read(fd, buf, sizeof(buf));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (r == 0) {
			fprintf(stderr, "ksmc-echo: EOF after %zu bytes\n", off);
			return 1;
		}
		for (ssize_t i = 0; i < r; i++) {
			if (buf[i] != (char)((off + i) % sizeof(buf))) {
				fprintf(stderr, "ksmc-echo: wrong byte at %zu\n", off + i);
				return 1;
			}
		}
		off += r;
		left -= r;
	}
	double dt = now() - t0;
	pthread_join(t, NULL);
	close(fd);
	printf("ksmc-echo: stream %s: %zu bytes echoed in %.3f s = %.2f MB/s each way\n",
	       proto, bytes, dt, bytes / dt / 1e6);
	return 0;
}

static int cmd_rr(const char *proto, const char *ip, int port, size_t size, int iters)
{
	int fd = connect_retry(proto, ip, port);
	char *buf = calloc(1, size);
	if (!buf)
		die("calloc");
	/* One warm-up round trip. */
	write_all(fd, buf, size);
	read_all(fd, buf, size);
	double t0 = now();
	for (int i = 0; i < iters; i++) {
		write_all(fd, buf, size);
		read_all(fd, buf, size);
	}
	double dt = now() - t0;
	close(fd);
	printf("ksmc-echo: rr %s: %d round trips of %zu bytes in %.3f s = %.2f usec/iter\n",
	       proto, iters, size, dt, dt * 1e6 / iters);
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: ksmc-echo ueid UEID\n"
		"       ksmc-echo server PORT CONNS\n"
		"       ksmc-echo stream smc|tcp IP PORT BYTES\n"
		"       ksmc-echo rr smc|tcp IP PORT SIZE ITERS\n");
	exit(2);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "ueid") == 0)
		return cmd_ueid(argv[2]);
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		return cmd_server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 6 && strcmp(argv[1], "stream") == 0)
		return cmd_stream(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 0));
	if (argc == 7 && strcmp(argv[1], "rr") == 0)
		return cmd_rr(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 0),
			      atoi(argv[6]));
	usage();
	return 2;
}
