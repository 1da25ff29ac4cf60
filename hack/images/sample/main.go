// Command sample is the dev cluster's sample workload
// (localhost/partita/sample:dev, docs/real-node.md): it prints its
// environment to its log, sorted, one KEY=VALUE a line, so that `kubectl
// logs` shows what a container was given (NVIDIA_VISIBLE_DEVICES, the
// CUDA_* limits), then waits until it is stopped. With --exit it prints and
// exits, for Jobs; with --lookup NAME it also resolves NAME through the
// pod's DNS and prints "lookup NAME: ADDRESSES" (or the error).
//
// The image has no shell, so the real node's tests ask it for the rest:
// --print-file PATH prints a file of the container (/proc/self/mountinfo:
// what it mounts) between "file PATH:" and "end of file PATH" lines, and
// --get URL makes one HTTPS request from inside the cluster (--method,
// with --token-file as its bearer token, --ca-file or --insecure for the
// server's certificate) and prints "get URL: STATUS" and "body: ..." (or
// "get URL: error: ...").
//
// --hash-dir DIR prints "sha256 HEX PATH" for every file under DIR (its
// path relative to DIR), then "hashed DIR: N files", and tries to write
// DIR: "write DIR: ok" or "write DIR: error: ..." (a model's directory is
// read-only).
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	exit := flag.Bool("exit", false, "exit after printing the environment instead of waiting")
	lookup := flag.String("lookup", "", "a DNS name to resolve and print, e.g. kubernetes.default")
	printFile := flag.String("print-file", "", "a file to print, e.g. /proc/self/mountinfo")
	var get request
	flag.StringVar(&get.url, "get", "", "an https URL to request once and print the answer of")
	flag.StringVar(&get.method, "method", http.MethodGet, "the method of --get")
	flag.StringVar(&get.tokenFile, "token-file", "", "a file whose content --get sends as bearer token")
	flag.StringVar(&get.caFile, "ca-file", "", "the CA that --get verifies the server's certificate with")
	flag.BoolVar(&get.insecure, "insecure", false, "--get does not verify the server's certificate")
	hashDir := flag.String("hash-dir", "", "a directory whose files to hash and print, e.g. /models/llama")
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
	if *printFile != "" {
		printContent(os.Stdout, *printFile)
	}
	if *hashDir != "" {
		hashTree(os.Stdout, *hashDir)
	}
	if get.url != "" {
		status, body, err := get.do()
		if err != nil {
			fmt.Printf("get %s: error: %v\n", get.url, err)
		} else {
			fmt.Printf("get %s: %d\nbody: %s\n", get.url, status, body)
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

// printContent writes the file's lines between markers, or the error.
func printContent(w io.Writer, path string) {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(w, "file %s: error: %v\n", path, err)
		return
	}
	defer func() { _ = f.Close() }()
	fmt.Fprintf(w, "file %s:\n", path)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fmt.Fprintln(w, sc.Text())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(w, "file %s: error: %v\n", path, err)
	}
	fmt.Fprintf(w, "end of file %s\n", path)
}

// hashTree prints each file's SHA-256 under dir, then whether dir takes a
// write.
func hashTree(w io.Writer, dir string) {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(w, "sha256 %s %s\n", hex.EncodeToString(h.Sum(nil)), filepath.ToSlash(rel))
		n++
		return nil
	})
	if err != nil {
		fmt.Fprintf(w, "hashed %s: error: %v\n", dir, err)
	} else {
		fmt.Fprintf(w, "hashed %s: %d files\n", dir, n)
	}
	if err := os.WriteFile(filepath.Join(dir, ".write-test"), []byte("x"), 0o644); err != nil {
		fmt.Fprintf(w, "write %s: error: %v\n", dir, err)
	} else {
		fmt.Fprintf(w, "write %s: ok\n", dir)
	}
}

// request is --get and its options.
type request struct {
	url, method, tokenFile, caFile string
	insecure                       bool
}

// do makes the request and returns its status and its body on one line
// (newlines replaced, at most 4 KiB).
func (r request) do() (int, string, error) {
	if !strings.HasPrefix(r.url, "https://") {
		return 0, "", errors.New("only https URLs")
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: r.insecure} //nolint:gosec // --insecure, for self-signed test servers
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return 0, "", err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return 0, "", fmt.Errorf("%s holds no PEM certificate", r.caFile)
		}
		tlsConfig.RootCAs = pool
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.method, r.url, nil)
	if err != nil {
		return 0, "", err
	}
	if r.tokenFile != "" {
		token, err := os.ReadFile(r.tokenFile)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return resp.StatusCode, "", err
	}
	return resp.StatusCode, strings.ReplaceAll(strings.TrimSpace(string(body)), "\n", " "), nil
}
