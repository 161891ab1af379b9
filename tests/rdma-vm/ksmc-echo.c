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
 *   ksmc-echo iserver PORT CONNS           interop server (two-kernel mode): serves
 *                                          CONNS exchanges (see smc_kernel_test.rs)
 *   ksmc-echo iclient IP PORT UP DOWN      interop client: one exchange
 *
 * The interop commands check each connection's mode with the kernel's smc_diag
 * (it must be SMC-R) and send their part as the header under TCP_CORK and the
 * payload by sendfile(2) from a file.
 *
 * Clients retry their connect (refused) for up to 60 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <linux/smc.h>
#include <linux/smc_diag.h>
#include <linux/sock_diag.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
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

/* ---- interop: smc_diag, pattern, cork + sendfile ---- */

/* The mode smc_diag reports for the AF_SMC socket fd (matched by inode), with
 * the fallback reason; -1 when it is not listed. */
static int diag_mode(int fd, unsigned *reason)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		die("fstat");
	int nl = socket(AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG);
	if (nl < 0)
		die("netlink socket");
	struct {
		struct nlmsghdr n;
		struct smc_diag_req r;
	} req;
	memset(&req, 0, sizeof(req));
	req.n.nlmsg_len = sizeof(req);
	req.n.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.n.nlmsg_seq = 1;
	req.r.diag_family = AF_SMC;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (sendto(nl, &req, sizeof(req), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("netlink send");
	static char buf[32768];
	int mode = -1;
	*reason = 0;
	for (;;) {
		int n = recv(nl, buf, sizeof(buf), 0);
		if (n < 0)
			die("netlink recv");
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE) {
				close(nl);
				return mode;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				fprintf(stderr, "ksmc-echo: smc_diag: error %d\n",
					((struct nlmsgerr *)NLMSG_DATA(h))->error);
				exit(1);
			}
			struct smc_diag_msg *m = NLMSG_DATA(h);
			if (m->diag_inode != st.st_ino)
				continue;
			mode = m->diag_mode;
			struct nlattr *a = (struct nlattr *)((char *)m + NLMSG_ALIGN(sizeof(*m)));
			int left = h->nlmsg_len - NLMSG_LENGTH(sizeof(*m));
			while (left >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= left) {
				if (a->nla_type == SMC_DIAG_FALLBACK)
					*reason = ((struct smc_diag_fallback *)((char *)a + NLA_HDRLEN))->reason;
				left -= NLA_ALIGN(a->nla_len);
				a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len));
			}
		}
	}
}

/* Prints the connection's mode; returns whether it is SMC-R. */
static int check_smcr(int fd, const char *who)
{
	unsigned reason;
	int mode = diag_mode(fd, &reason);
	const char *name = mode == SMC_DIAG_MODE_SMCR ? "SMCR" :
			   mode == SMC_DIAG_MODE_SMCD ? "SMCD" :
			   mode == SMC_DIAG_MODE_FALLBACK_TCP ? "TCP" : "unlisted";
	printf("ksmc-echo: %s: smc_diag mode %s (fallback reason 0x%08x)\n", who, name, reason);
	return mode == SMC_DIAG_MODE_SMCR;
}

static unsigned char pattern(unsigned long long i)
{
	return (unsigned char)((i * 7 + 3) % 251);
}

static void read_checked(int fd, unsigned long long len)
{
	static unsigned char buf[1 << 16];
	for (unsigned long long at = 0; at < len;) {
		size_t n = len - at < sizeof(buf) ? len - at : sizeof(buf);
		read_all(fd, (char *)buf, n);
		for (size_t i = 0; i < n; i++)
			if (buf[i] != pattern(at + i)) {
				fprintf(stderr, "ksmc-echo: wrong byte at %llu\n", at + i);
				exit(1);
			}
		at += n;
	}
}

/* header under TCP_CORK, then len pattern bytes by sendfile(2), then uncork. */
static void send_corked(int fd, const void *hdr, size_t hlen, unsigned long long len)
{
	char path[] = "/tmp/ksmc-echo-XXXXXX";
	int f = mkstemp(path);
	if (f < 0)
		die("mkstemp");
	unlink(path);
	static unsigned char chunk[1 << 16];
	for (unsigned long long at = 0; at < len;) {
		size_t n = len - at < sizeof(chunk) ? len - at : sizeof(chunk);
		for (size_t i = 0; i < n; i++)
			chunk[i] = pattern(at + i);
		write_all(f, (char *)chunk, n);
		at += n;
	}
	int one = 1, zero = 0;
	if (setsockopt(fd, IPPROTO_TCP, TCP_CORK, &one, sizeof(one)) < 0)
		die("TCP_CORK on");
	write_all(fd, hdr, hlen);
	off_t off = 0;
	while ((unsigned long long)off < len) {
		ssize_t n = sendfile(fd, f, &off, len - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("sendfile");
		}
		if (n == 0) {
			fprintf(stderr, "ksmc-echo: sendfile sent nothing\n");
			exit(1);
		}
	}
	if (setsockopt(fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof(zero)) < 0)
		die("TCP_CORK off");
	close(f);
}

static int cmd_iserver(int port, int conns)
{
	int fd = open_sock("smc");
	int one = 1, ok = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind");
	if (listen(fd, 16) < 0)
		die("listen");
	printf("ksmc-echo: interop server on port %d for %d connection(s)\n", port, conns);
	for (int i = 0; i < conns; i++) {
		int c = accept(fd, NULL, NULL);
		if (c < 0)
			die("accept");
		ok &= check_smcr(c, "iserver");
		unsigned long long hdr[2];
		read_all(c, (char *)hdr, sizeof(hdr));
		read_checked(c, hdr[0]);
		send_corked(c, &hdr[1], sizeof(hdr[1]), hdr[1]);
		char rest;
		if (read(c, &rest, 1) != 0) {
			fprintf(stderr, "ksmc-echo: no EOF after the exchange\n");
			return 1;
		}
		printf("ksmc-echo: iserver: received %llu bytes intact, sent %llu (TCP_CORK + sendfile)\n",
		       hdr[0], hdr[1]);
		close(c);
	}
	return ok ? 0 : 1;
}

static int cmd_iclient(const char *ip, int port, unsigned long long up, unsigned long long down)
{
	int fd = connect_retry("smc", ip, port);
	int ok = check_smcr(fd, "iclient");
	unsigned long long hdr[2] = { up, down };
	send_corked(fd, hdr, sizeof(hdr), up);
	unsigned long long len;
	read_all(fd, (char *)&len, sizeof(len));
	if (len != down) {
		fprintf(stderr, "ksmc-echo: the server announced %llu bytes, not %llu\n", len, down);
		return 1;
	}
	read_checked(fd, down);
	shutdown(fd, SHUT_WR);
	printf("ksmc-echo: iclient: sent %llu bytes (TCP_CORK + sendfile), received %llu intact\n", up, down);
	close(fd);
	return ok ? 0 : 1;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: ksmc-echo ueid UEID\n"
		"       ksmc-echo server PORT CONNS\n"
		"       ksmc-echo stream smc|tcp IP PORT BYTES\n"
		"       ksmc-echo rr smc|tcp IP PORT SIZE ITERS\n"
		"       ksmc-echo iserver PORT CONNS\n"
		"       ksmc-echo iclient IP PORT UP DOWN\n");
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
	if (argc == 4 && strcmp(argv[1], "iserver") == 0)
		return cmd_iserver(atoi(argv[2]), atoi(argv[3]));
	if (argc == 6 && strcmp(argv[1], "iclient") == 0)
		return cmd_iclient(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0),
				   strtoull(argv[5], NULL, 0));
	usage();
	return 2;
}
