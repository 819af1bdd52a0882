// Package containerd owns delivery into containerd, the runtime Kubernetes
// nodes use: importing kiln's images with their index digest intact, and
// running their binaries there (smoke tests).
package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Defaults follow containerd's and Kubernetes' conventions.
const (
	AddressEnv       = "CONTAINERD_ADDRESS"
	DefaultAddress   = "/run/containerd/containerd.sock"
	DefaultNamespace = "k8s.io"
	snapshotter      = "overlayfs"
)

// Address is the flag's value, else CONTAINERD_ADDRESS, else the default.
func Address(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(AddressEnv); env != "" {
		return env
	}
	return DefaultAddress
}

// Connect dials containerd and checks that it answers.
func Connect(ctx context.Context, address string) (*ctd.Client, error) {
	address = strings.TrimPrefix(address, "unix://")
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("containerd address %q must be an absolute socket path", address)
	}
	if _, err := os.Stat(address); err != nil {
		return nil, fmt.Errorf("containerd at %s: %w; start containerd or point -address/%s at its socket", address, err, AddressEnv)
	}
	c, err := ctd.New(address, ctd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w; check that containerd runs and that you may use its socket", address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Version(vctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w; check that containerd runs and that you may use its socket", address, err)
	}
	return c, nil
}

// Import reads an OCI layout tarball (a stream is fine: nothing is staged on
// disk) into the namespace, all platforms, and returns the image with the
// index digest it got.
func Import(ctx context.Context, c *ctd.Client, namespace string, r io.Reader) ([]images.Image, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	imgs, err := c.Import(ctx, r, ctd.WithAllPlatforms(true), ctd.WithSkipDigestRef(func(string) bool { return true }))
	if err != nil {
		return nil, fmt.Errorf("import into containerd namespace %s: %w", namespace, err)
	}
	return imgs, nil
}

// Runnable reports whether this machine can run a platform's binaries:
// natively, or through a registered qemu binfmt handler.
func Runnable(p ocispec.Platform) (bool, string) {
	if p.OS != "linux" {
		return false, "not a linux platform"
	}
	if p.Architecture == runtime.GOARCH {
		return true, ""
	}
	handler := map[string]string{"arm64": "qemu-aarch64", "arm": "qemu-arm", "amd64": "qemu-x86_64", "ppc64le": "qemu-ppc64le", "s390x": "qemu-s390x", "riscv64": "qemu-riscv64", "386": "qemu-i386"}[p.Architecture]
	if handler == "" {
		return false, "no qemu handler known for " + p.Architecture
	}
	data, err := os.ReadFile("/proc/sys/fs/binfmt_misc/" + handler)
	if err != nil || !bytes.HasPrefix(data, []byte("enabled")) {
		return false, fmt.Sprintf("binfmt handler %s is not registered (apt-get install qemu-user-static binfmt-support; mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable %s)", handler, handler)
	}
	return true, ""
}

// Run runs one command in an image for one platform and returns its output.
func Run(ctx context.Context, c *ctd.Client, namespace, ref string, p ocispec.Platform, args ...string) (string, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	rec, err := c.ImageService().Get(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("image %s in namespace %s: %w; load it with `mage images:load`", ref, namespace, err)
	}
	img := ctd.NewImageWithPlatform(c, rec, platforms.Only(p))
	if err := img.Unpack(ctx, snapshotter); err != nil {
		return "", fmt.Errorf("unpack %s for %s: %w", ref, platforms.Format(p), err)
	}
	id := fmt.Sprintf("kiln-smoke-%d", time.Now().UnixNano())
	container, err := c.NewContainer(ctx, id,
		ctd.WithImage(img),
		ctd.WithSnapshotter(snapshotter),
		ctd.WithNewSnapshot(id, img),
		ctd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...)))
	if err != nil {
		return "", fmt.Errorf("create container from %s: %w", ref, err)
	}
	defer container.Delete(context.WithoutCancel(ctx), ctd.WithSnapshotCleanup)
	var stdout, stderr bytes.Buffer
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	if err != nil {
		return "", fmt.Errorf("start %v in %s (%s): %w", args, ref, platforms.Format(p), err)
	}
	// Delete kills and waits for a task still running (a timeout): deleting
	// a live task fails, and then the container and its snapshot leak.
	defer task.Delete(context.WithoutCancel(ctx), ctd.WithProcessKill)
	exitc, err := task.Wait(ctx)
	if err != nil {
		return "", err
	}
	if err := task.Start(ctx); err != nil {
		return "", fmt.Errorf("start %v in %s (%s): %w", args, ref, platforms.Format(p), err)
	}
	var status ctd.ExitStatus
	select {
	case status = <-exitc:
	case <-time.After(60 * time.Second):
		task.Kill(ctx, 9)
		select {
		case <-exitc:
		case <-time.After(10 * time.Second):
		}
		return "", errors.New("timed out after 60s")
	}
	code, _, err := status.Result()
	if err != nil {
		return "", err
	}
	// The output is copied from the task's FIFOs after it exits: wait for
	// the copy, or a loaded machine reads an empty buffer.
	task.IO().Wait()
	if code != 0 {
		return stdout.String(), fmt.Errorf("%v in %s (%s) exited %d: %s", args, ref, platforms.Format(p), code, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
