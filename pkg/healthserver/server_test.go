package healthserver

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDaemonsServeAndStopOnSIGTERM runs the real binaries.
func TestDaemonsServeAndStopOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	for _, name := range []string{"antrea-agent", "antrea-controller"} {
		t.Run(name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), name)
			build := exec.Command("go", "build", "-o", bin, "../../cmd/"+name)
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			cmd := exec.Command(bin, "--addr", addr)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			var resp *http.Response
			for i := 0; i < 100; i++ {
				if resp, err = http.Get("http://" + addr + "/healthz"); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("healthz: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("healthz: %s", resp.Status)
			}
			resp, err = http.Get("http://" + addr + "/version")
			if err != nil {
				t.Fatal(err)
			}
			var body strings.Builder
			buf := make([]byte, 4096)
			n, _ := resp.Body.Read(buf)
			body.Write(buf[:n])
			resp.Body.Close()
			if !strings.Contains(body.String(), `"binary":"`+name+`"`) || !strings.Contains(body.String(), `"cgoEnabled":false`) {
				t.Errorf("version: %s", body.String())
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("exit after SIGTERM: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("did not stop within 10s of SIGTERM")
			}
		})
	}
}

func TestMetricsAreServedInPrometheusFormat(t *testing.T) {
	srv := httptest.NewServer(Handler("antrea-agent"))
	defer srv.Close()
	for _, path := range []string{"/healthz", "/healthz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if path == "/metrics" {
			for _, want := range []string{`antrea_http_requests_total{binary="antrea-agent",path="/healthz"} 2`, "antrea_build_info{", "go_goroutines"} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/metrics lacks %q:\n%s", want, body)
				}
			}
		}
	}
}
