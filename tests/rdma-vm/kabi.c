/*
 * kabi: the kernel SMC facts smc-tokio's `kernel` module assumes, printed from
 * the installed UAPI headers in the format of `smc-kernel-test abi`. run.sh
 * two-kernel diffs the two before any guest boots (a mismatch is status 3).
 *
 * SMCPROTO_SMC and SMCPROTO_SMC6 are not in the UAPI headers (net/smc/smc.h
 * defines them); they are printed as the kernel defines them, and the guests
 * exercise them for real (both interop directions open AF_SMC sockets with
 * protocol SMCPROTO_SMC).
 */
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <linux/smc.h>
#include <linux/smc_diag.h>
#include <linux/sock_diag.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif
#ifndef SOL_SMC
#define SOL_SMC 286
#endif

int main(void)
{
	printf("AF_SMC %d\n", AF_SMC);
	printf("SMCPROTO_SMC %d\n", 0);
	printf("SMCPROTO_SMC6 %d\n", 1);
	printf("SOL_SMC %d\n", SOL_SMC);
	printf("SMC_LIMIT_HS %d\n", SMC_LIMIT_HS);
	printf("NETLINK_SOCK_DIAG %d\n", NETLINK_SOCK_DIAG);
	printf("SOCK_DIAG_BY_FAMILY %d\n", SOCK_DIAG_BY_FAMILY);
	printf("sizeof_smc_diag_req %zu\n", sizeof(struct smc_diag_req));
	printf("sizeof_smc_diag_msg %zu\n", sizeof(struct smc_diag_msg));
	printf("offsetof_smc_diag_msg_diag_inode %zu\n", offsetof(struct smc_diag_msg, diag_inode));
	printf("SMC_DIAG_FALLBACK %d\n", SMC_DIAG_FALLBACK);
	printf("SMC_DIAG_MODE_SMCR %d\n", SMC_DIAG_MODE_SMCR);
	printf("SMC_DIAG_MODE_FALLBACK_TCP %d\n", SMC_DIAG_MODE_FALLBACK_TCP);
	printf("SMC_DIAG_MODE_SMCD %d\n", SMC_DIAG_MODE_SMCD);
	printf("SMC_GENL_FAMILY_VERSION %d\n", SMC_GENL_FAMILY_VERSION);
	printf("SMC_NETLINK_DUMP_HS_LIMITATION %d\n", SMC_NETLINK_DUMP_HS_LIMITATION);
	printf("SMC_NETLINK_ENABLE_HS_LIMITATION %d\n", SMC_NETLINK_ENABLE_HS_LIMITATION);
	printf("SMC_NETLINK_DISABLE_HS_LIMITATION %d\n", SMC_NETLINK_DISABLE_HS_LIMITATION);
	printf("SMC_NLA_HS_LIMITATION_ENABLED %d\n", SMC_NLA_HS_LIMITATION_ENABLED);
	printf("GENL_ID_CTRL %d\n", GENL_ID_CTRL);
	return 0;
}
