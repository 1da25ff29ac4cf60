// Command sample is the dev cluster's sample workload
// (localhost/partita/sample:dev, docs/real-node.md): it prints its
// environment to its log, sorted, one KEY=VALUE a line, so that `kubectl
// logs` shows what a container was given (NVIDIA_VISIBLE_DEVICES, the
// CUDA_* limits), then waits until it is stopped. With --exit it prints and
// exits, for Jobs; with --lookup NAME it also resolves NAME through the
// pod's DNS and prints "lookup NAME: ADDRESSES" (or the error).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	exit := flag.Bool("exit", false, "exit after printing the environment instead of waiting")
	lookup := flag.String("lookup", "", "a DNS name to resolve and print, e.g. kubernetes.default")
	flag.Parse()
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println(kv)
	}
	if *lookup != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, *lookup)
		cancel()
		if err != nil {
			fmt.Printf("lookup %s: error: %v\n", *lookup, err)
		} else {
			sort.Strings(addrs)
			fmt.Printf("lookup %s: %s\n", *lookup, strings.Join(addrs, ","))
		}
	}
	if *exit {
		return
	}
	// PID 1 of a container gets no default signal handlers: without these,
	// SIGTERM would be ignored until the grace period ends.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
