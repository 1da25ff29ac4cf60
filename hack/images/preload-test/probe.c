/*
 * The workload of the real node's hami-core tests, dynamically linked so
 * that the loader reads /etc/ld.so.preload, in an image with no shell
 * (localhost/partita/interposer-test:dev, built by hack/images):
 *
 *   probe               waits until SIGTERM (a container to exec into)
 *   probe loaded LIB    exits 0 if LIB is mapped into this process
 *   probe cat FILE      prints FILE
 *   probe tamper        tries, as whoever it runs as, every way to change
 *                       /etc/ld.so.preload and the interposer directory;
 *                       prints one line per try and exits 0 only if each
 *                       one failed
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define PRELOAD "/etc/ld.so.preload"
#define DIR "/usr/local/partita/interposer"
#define LIB DIR "/libvgpu.so"

static void stop(int sig) { (void)sig; _exit(0); }

static void wait_for_term(void) {
	/* PID 1 of a container ignores SIGTERM unless it handles it. */
	signal(SIGTERM, stop);
	signal(SIGINT, stop);
	printf("probe: waiting\n");
	fflush(stdout);
	for (;;)
		pause();
}

static int loaded(const char *lib) {
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	int found = 0;
	if (f == NULL) {
		perror("probe: /proc/self/maps");
		return 2;
	}
	while (fgets(line, sizeof line, f) != NULL) {
		if (strstr(line, lib) != NULL) {
			found = 1;
			fputs(line, stdout);
		}
	}
	fclose(f);
	printf("loaded %s: %s\n", lib, found ? "yes" : "no");
	return found ? 0 : 1;
}

static int cat(const char *path) {
	FILE *f = fopen(path, "r");
	char buf[4096];
	size_t n;
	if (f == NULL) {
		printf("cat %s: %s\n", path, strerror(errno));
		return 1;
	}
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, n, stdout);
	fclose(f);
	return 0;
}

static int changed;

/* report prints what a try did: refused (its errno) or done. */
static void report(const char *what, int rc) {
	if (rc < 0) {
		printf("%s: refused: %s\n", what, strerror(errno));
		return;
	}
	changed = 1;
	printf("%s: DONE\n", what);
}

static int openw(const char *path, int flags) {
	int fd = open(path, O_WRONLY | flags, 0644);
	if (fd >= 0) {
		/* Opening for writing is already a change of who may write. */
		if (flags & O_TRUNC || write(fd, "\n", 1) >= 0) {
			close(fd);
			return 0;
		}
		close(fd);
		return -1;
	}
	return -1;
}

static int tamper(void) {
	char tmp[] = "/tmp/probe-preload-XXXXXX";
	int fd;
	printf("uid %d euid %d\n", (int)getuid(), (int)geteuid());
	report("truncate " PRELOAD, openw(PRELOAD, O_TRUNC));
	report("append to " PRELOAD, openw(PRELOAD, O_APPEND));
	report("chmod " PRELOAD, chmod(PRELOAD, 0666));
	report("chown " PRELOAD, chown(PRELOAD, 65534, 65534));
	report("unlink " PRELOAD, unlink(PRELOAD));
	fd = mkstemp(tmp);
	if (fd >= 0) {
		close(fd);
		report("rename over " PRELOAD, rename(tmp, PRELOAD));
		unlink(tmp);
	} else {
		printf("rename over %s: skipped, no temporary file: %s\n", PRELOAD, strerror(errno));
	}
	report("remount " PRELOAD " read-write", mount(NULL, PRELOAD, NULL, MS_REMOUNT | MS_BIND, NULL));
	report("bind mount over " PRELOAD, mount("/proc/self/cmdline", PRELOAD, NULL, MS_BIND, NULL));
	report("unmount " PRELOAD, umount2(PRELOAD, MNT_DETACH));
	report("write " LIB, openw(LIB, O_APPEND));
	report("unlink " LIB, unlink(LIB));
	report("create a file in " DIR, openw(DIR "/probe.so", O_CREAT));
	report("remount " DIR " read-write", mount(NULL, DIR, NULL, MS_REMOUNT | MS_BIND, NULL));
	report("unmount " DIR, umount2(DIR, MNT_DETACH));
	printf("tamper: %s\n", changed ? "SOMETHING CHANGED" : "every try refused");
	return changed;
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		wait_for_term();
	if (strcmp(argv[1], "loaded") == 0 && argc == 3)
		return loaded(argv[2]);
	if (strcmp(argv[1], "cat") == 0 && argc == 3)
		return cat(argv[2]);
	if (strcmp(argv[1], "tamper") == 0 && argc == 2)
		return tamper();
	fprintf(stderr, "usage: probe [loaded LIB | cat FILE | tamper]\n");
	return 2;
}
