package managed

import (
	"slices"
	"testing"
	"time"

	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/golang"
)

func TestPruneKeepsCachesSourcesStandardLibrariesAndTheLastModuleLayerToolAndToolchain(t *testing.T) {
	at := func(min int) *time.Time { x := time.Date(2026, 11, 30, 10, min, 0, 0, time.UTC); return &x }
	usage := []*client.UsageInfo{
		{ID: "gocache", RecordType: client.UsageRecordTypeCacheMount, Description: "cached mount /root/.cache/go-build from exec"},
		{ID: "left-by-an-isolated-rebuild", RecordType: client.UsageRecordTypeCacheMount, Description: `cached mount /root/.cache/go-build from exec go build with id "` + golang.IsolatedCachePrefix + `0123456789abcdef"`},
		{ID: "go-tmp", RecordType: client.UsageRecordTypeCacheMount, Description: `cached mount /tmp from exec go build with id "` + golang.GoTmpCacheID + `"`},
		{ID: "context", RecordType: client.UsageRecordTypeLocalSource, Description: "local source for context"},
		{ID: "old-modules", RecordType: client.UsageRecordTypeRegular, Description: "mount /go/pkg/mod from exec /usr/local/go/bin/go mod download a@v1", LastUsedAt: at(1)},
		{ID: "modules", RecordType: client.UsageRecordTypeRegular, Description: "mount /go/pkg/mod from exec /usr/local/go/bin/go mod download a@v2", LastUsedAt: at(5)},
		{ID: "tool", RecordType: client.UsageRecordTypeRegular, Description: "mount /kiln/tools from exec /usr/local/go/bin/go build -trimpath -o /kiln/tools/kilnstep main.go", LastUsedAt: at(3)},
		{ID: "go-build", RecordType: client.UsageRecordTypeRegular, Description: "mount /out from exec /kiln/bin/kilnstep gobuild", LastUsedAt: at(9)},
		{ID: "std-amd64", RecordType: client.UsageRecordTypeRegular, Description: "mount " + golang.StdDir + " from exec /kiln/bin/kilnstep gobuild /kiln/keep /out  1 - -- go build fmt", LastUsedAt: at(6)},
		{ID: "std-arm64", RecordType: client.UsageRecordTypeRegular, Description: "mount " + golang.StdDir + " from exec /kiln/bin/kilnstep gobuild /kiln/keep /out  1 - -- go build fmt", LastUsedAt: at(7)},
		{ID: "toolchain", RecordType: client.UsageRecordTypeRegular, Description: golang.ToolchainStep + "1.26.8", LastUsedAt: at(4)},
		{ID: "old-toolchain", RecordType: client.UsageRecordTypeRegular, Description: golang.ToolchainStep + "1.26.7", LastUsedAt: at(2)},
		{ID: "image-layer", RecordType: client.UsageRecordTypeRegular, Description: "mount / from exec /bin/sh"},
	}
	got := unkept(usage)
	slices.Sort(got)
	if want := []string{"go-build", "go-tmp", "image-layer", "left-by-an-isolated-rebuild", "old-modules", "old-toolchain"}; !slices.Equal(got, want) {
		t.Errorf("pruned %v, want %v", got, want)
	}
}

func TestTheBenchsColdKeepsOnlyTheTools(t *testing.T) {
	tools := []*client.UsageInfo{
		{RecordType: client.UsageRecordTypeRegular, Description: golang.ToolchainStep + "1.26.8"},
		{RecordType: client.UsageRecordTypeRegular, Description: golang.VCSToolsStep},
		{RecordType: client.UsageRecordTypeRegular, Description: "mount " + golang.ToolsDir + " from exec /usr/local/go/bin/go build -trimpath -o /kiln/tools/kilnstep main.go"},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for " + golang.LocalToolchain},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for " + golang.LocalStepTool},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for " + golang.LocalVCSTools},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for " + golang.LocalCACerts},
	}
	work := []*client.UsageInfo{
		{RecordType: client.UsageRecordTypeCacheMount, Description: `cached mount /root/.cache/go-build from exec go build with id "kiln-gocache"`},
		{RecordType: client.UsageRecordTypeCacheMount, Description: "cached mount " + golang.ToolsDir + " from exec go build"},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for sources-65171fce8af68b99"},
		{RecordType: client.UsageRecordTypeLocalSource, Description: "local source for " + golang.LocalToolchain + "-other"},
		{RecordType: client.UsageRecordTypeRegular, Description: "mount " + golang.ModuleLayerDir + " from exec /kiln/bin/kilnstep modules"},
		{RecordType: client.UsageRecordTypeRegular, Description: "mount " + golang.StdDir + " from exec /kiln/bin/kilnstep gobuild"},
		{RecordType: client.UsageRecordTypeRegular, Description: golang.VendorStep},
		{RecordType: client.UsageRecordTypeRegular, Description: "mount /out/0 from exec /kiln/bin/kilnstep gobuild"},
	}
	for _, u := range tools {
		if !toolRecord(u) {
			t.Errorf("%s %q is pruned: it is a tool", u.RecordType, u.Description)
		}
	}
	for _, u := range work {
		if toolRecord(u) {
			t.Errorf("%s %q is kept: it is a build's work", u.RecordType, u.Description)
		}
	}
}
