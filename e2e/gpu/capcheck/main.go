// Command capcheck measures how much GPU memory one process gets: it loads
// the NVIDIA driver's CUDA library (libcuda.so.1) through purego, so it
// needs no CUDA toolkit and no C compiler, creates a context on a device
// and calls cuMemAlloc in steps until an allocation fails or --max is
// reached. It prints one JSON object and, with --hold, keeps the memory
// for that long before freeing it (so that a second process can run
// beside it).
//
// Whatever caps the process (HAMi-core's libvgpu.so through LD_PRELOAD or
// /etc/ld.so.preload with CUDA_DEVICE_MEMORY_LIMIT, an MPS client's
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) shows as the allocation that fails.
// e2e/gpu/check.sh runs it once per isolation mode the machine has.
//
// Exit status: 0 when it measured, 2 when the machine has no CUDA driver
// or no device, 1 on any other error.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

const mib = 1 << 20

// result is what capcheck prints.
type result struct {
	Device         int    `json:"device"`
	StepMiB        int64  `json:"stepMiB"`
	MaxMiB         int64  `json:"maxMiB,omitempty"`
	AllocatedMiB   int64  `json:"allocatedMiB"`
	Allocations    int    `json:"allocations"`
	StoppedBy      string `json:"stoppedBy"`
	FreeBeforeMiB  int64  `json:"freeBeforeMiB"`
	TotalMiB       int64  `json:"totalMiB"`
	MemoryLimitEnv string `json:"memoryLimitEnv,omitempty"`
	MPSLimitEnv    string `json:"mpsLimitEnv,omitempty"`
}

// noDevice is an error that means the machine cannot run the check at all.
type noDevice struct{ err error }

func (e noDevice) Error() string { return e.err.Error() }
func (e noDevice) Unwrap() error { return e.err }

func main() {
	device := flag.Int("device", 0, "the CUDA device ordinal")
	stepMiB := flag.Int64("step", 256, "MiB per cuMemAlloc")
	maxMiB := flag.Int64("max", 0, "stop once this many MiB are allocated (0: until an allocation fails)")
	hold := flag.Duration("hold", 0, "keep the memory this long before freeing it")
	library := flag.String("library", "libcuda.so.1", "the CUDA driver library")
	flag.Parse()
	res, err := measure(*library, *device, *stepMiB, *maxMiB, *hold)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capcheck:", err)
		if errors.As(err, new(noDevice)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "capcheck:", err)
		os.Exit(1)
	}
}

// driver is the part of the CUDA driver API capcheck calls. CUresult is an
// int; 0 is CUDA_SUCCESS.
type driver struct {
	cuInit         func(flags uint32) int32
	cuDeviceGet    func(dev *int32, ordinal int32) int32
	cuCtxCreate    func(ctx *uintptr, flags uint32, dev int32) int32
	cuMemGetInfo   func(free, total *uint64) int32
	cuMemAlloc     func(ptr *uint64, bytes uint64) int32
	cuMemFree      func(ptr uint64) int32
	cuGetErrorName func(res int32, name **byte) int32
}

// CUresult values capcheck tells apart.
const (
	cudaSuccess              = 0
	cudaErrorNoDevice        = 100
	cudaErrorInvalidDevice   = 101
	cudaErrorNotInitialized  = 3
	cudaErrorInsufficientDrv = 35
)

func load(library string) (*driver, error) {
	lib, err := purego.Dlopen(library, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, noDevice{fmt.Errorf("load the CUDA driver %s (no NVIDIA driver here?): %w", library, err)}
	}
	d := &driver{}
	// The _v2 entry points take 64-bit sizes and pointers; HAMi-core
	// interposes on these names.
	for name, fn := range map[string]any{
		"cuInit": &d.cuInit, "cuDeviceGet": &d.cuDeviceGet, "cuCtxCreate_v2": &d.cuCtxCreate,
		"cuMemGetInfo_v2": &d.cuMemGetInfo, "cuMemAlloc_v2": &d.cuMemAlloc, "cuMemFree_v2": &d.cuMemFree,
		"cuGetErrorName": &d.cuGetErrorName,
	} {
		if _, err := purego.Dlsym(lib, name); err != nil {
			return nil, fmt.Errorf("find %s in %s: %w", name, library, err)
		}
		purego.RegisterLibFunc(fn, lib, name)
	}
	return d, nil
}

// errorName is the CUresult's name, e.g. CUDA_ERROR_OUT_OF_MEMORY.
func (d *driver) errorName(res int32) string {
	var p *byte
	if d.cuGetErrorName(res, &p) != cudaSuccess || p == nil {
		return fmt.Sprintf("CUresult %d", res)
	}
	var b []byte
	for i := 0; i < 128; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

func (d *driver) call(what string, res int32) error {
	switch res {
	case cudaSuccess:
		return nil
	case cudaErrorNoDevice, cudaErrorInvalidDevice, cudaErrorInsufficientDrv, cudaErrorNotInitialized:
		return noDevice{fmt.Errorf("%s: %s", what, d.errorName(res))}
	}
	return fmt.Errorf("%s: %s", what, d.errorName(res))
}

func measure(library string, device int, stepMiB, maxMiB int64, hold time.Duration) (*result, error) {
	if stepMiB <= 0 {
		return nil, fmt.Errorf("--step %d: want a positive number of MiB", stepMiB)
	}
	d, err := load(library)
	if err != nil {
		return nil, err
	}
	if err := d.call("cuInit", d.cuInit(0)); err != nil {
		return nil, err
	}
	var dev int32
	if err := d.call(fmt.Sprintf("cuDeviceGet(%d)", device), d.cuDeviceGet(&dev, int32(device))); err != nil {
		return nil, err
	}
	var ctx uintptr
	if err := d.call("cuCtxCreate", d.cuCtxCreate(&ctx, 0, dev)); err != nil {
		return nil, err
	}
	var free, total uint64
	if err := d.call("cuMemGetInfo", d.cuMemGetInfo(&free, &total)); err != nil {
		return nil, err
	}
	res := &result{
		Device: device, StepMiB: stepMiB, MaxMiB: maxMiB,
		FreeBeforeMiB: int64(free / mib), TotalMiB: int64(total / mib),
		MemoryLimitEnv: os.Getenv("CUDA_DEVICE_MEMORY_LIMIT"), MPSLimitEnv: os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
	}
	var ptrs []uint64
	for {
		if maxMiB > 0 && res.AllocatedMiB+stepMiB > maxMiB {
			res.StoppedBy = "max"
			break
		}
		var p uint64
		if r := d.cuMemAlloc(&p, uint64(stepMiB)*mib); r != cudaSuccess {
			res.StoppedBy = d.errorName(r)
			break
		}
		ptrs = append(ptrs, p)
		res.Allocations++
		res.AllocatedMiB += stepMiB
	}
	if hold > 0 {
		// Say what was got before holding, so that a caller can start
		// the next process.
		fmt.Fprintf(os.Stderr, "capcheck: holding %d MiB for %s\n", res.AllocatedMiB, hold)
		time.Sleep(hold)
	}
	for _, p := range ptrs {
		_ = d.cuMemFree(p)
	}
	return res, nil
}
