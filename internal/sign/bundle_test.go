package sign

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// statementOf is an in-toto statement of predicateType about subject.
func statementOf(t *testing.T, subject digest.Digest, predicateType string, predicate map[string]any) []byte {
	t.Helper()
	p, err := structpb.NewStruct(predicate)
	if err != nil {
		t.Fatal(err)
	}
	st, err := StatementJSON(&intoto.Statement{Type: intoto.StatementTypeUri, PredicateType: predicateType, Predicate: p,
		Subject: []*intoto.ResourceDescriptor{{Name: "image", Digest: map[string]string{"sha256": subject.Encoded()}}}})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func signatureStatement(t *testing.T, d digest.Digest) []byte {
	st, err := SignatureStatement(d)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cosign v3's layout, proven with the real cosign CLI and kiln's own
// verifier: bundles as OCI referrers on a registry without the referrers
// API (the tag schema), a re-release that replaces them, and the bundles
// an attacker with write access to the repository can add.
func TestBundlesAsReferrersVerifyWithCosign(t *testing.T) {
	reg := testdaemon.StartRegistry(t)
	keys := testdaemon.CosignKeyPair(t, "pw")
	other := testdaemon.CosignKeyPair(t, "other")
	pub, otherPub := filepath.Join(keys, "cosign.pub"), filepath.Join(other, "cosign.pub")
	signer, err := LoadKey(filepath.Join(keys, "cosign.key"), []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	attacker, err := LoadKey(filepath.Join(other, "cosign.key"), []byte("other"))
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	resolver := buildkit.Resolver(true, false, buildkit.Credentials())
	repo := reg.Addr + "/antrea/antrea-agent"
	image := func(tag string) ocispec.Descriptor {
		reg.PushLayer(t, "antrea/antrea-agent", []string{tag}, []byte(tag+" layer"))
		dg, mediaType, body, err := reg.Manifest("antrea/antrea-agent", tag)
		if err != nil {
			t.Fatal(err)
		}
		return ocispec.Descriptor{MediaType: mediaType, Digest: digest.Digest(dg), Size: int64(len(body))}
	}
	release := func(s *Signer, subject ocispec.Descriptor, named digest.Digest) {
		t.Helper()
		var refs []Referrer
		for _, st := range []struct {
			data []byte
			typ  string
		}{
			{signatureStatement(t, named), SignPredicateType},
			{statementOf(t, named, "https://slsa.dev/provenance/v1", map[string]any{"buildDefinition": map[string]any{"buildType": "https://kiln.example/build/v1"}, "runDetails": map[string]any{"builder": map[string]any{"id": "https://kiln.example"}}}), "https://slsa.dev/provenance/v1"},
			{statementOf(t, named, "https://spdx.dev/Document", map[string]any{"spdxVersion": "SPDX-2.3", "SPDXID": "SPDXRef-DOCUMENT", "name": "antrea-agent"}), "https://spdx.dev/Document"},
		} {
			b, err := s.Bundle(st.data)
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, Referrer{Bundle: b, PredicateType: st.typ})
		}
		if _, err := AttachReferrers(ctx, resolver, repo, subject, refs); err != nil {
			t.Fatal(err)
		}
	}
	cosign := func(args ...string) (string, error) {
		out, err := exec.Command(testdaemon.Cosign(t), append(args[:1:1], append([]string{"--insecure-ignore-tlog", "--allow-http-registry"}, args[1:]...)...)...).CombinedOutput()
		return string(out), err
	}

	signed := image("v1")
	release(signer, signed, signed.Digest)
	_, _, firstIndex, err := reg.Manifest("antrea/antrea-agent", fallbackTag(signed.Digest))
	if err != nil {
		t.Fatal(err)
	}
	release(signer, signed, signed.Digest) // a release run again replaces its bundles
	ref := repo + "@" + signed.Digest.String()
	if out, err := cosign("verify", "--key", pub, ref); err != nil {
		t.Errorf("cosign verify --key of a bundle: %v\n%s", err, out)
	}
	if out, err := cosign("verify", "--key", otherPub, ref); err == nil {
		t.Errorf("cosign verify passed with another key:\n%s", out)
	}
	for _, typ := range []string{"slsaprovenance1", "spdxjson"} {
		out, err := cosign("verify-attestation", "--key", pub, "--type", typ, ref)
		if err != nil {
			t.Errorf("cosign verify-attestation --type %s: %v\n%s", typ, err, out)
		}
	}
	if err := verifier.VerifyImage(ctx, resolver, repo, signed.Digest); err != nil {
		t.Errorf("kiln's verifier: %v", err)
	}
	sts, err := verifier.VerifyAttestations(ctx, resolver, repo, signed.Digest)
	if err != nil || len(sts) != 2 || sts[0].PredicateType == sts[1].PredicateType {
		t.Errorf("kiln read %d attestations (%v), want the provenance and the SBOM once each", len(sts), err)
	}
	_, _, body, err := reg.Manifest("antrea/antrea-agent", fallbackTag(signed.Digest))
	var index ocispec.Index
	if err != nil || json.Unmarshal(body, &index) != nil || len(index.Manifests) != 3 {
		t.Errorf("the referrers tag schema's index lists %d manifests after two releases (%v), want 3", len(index.Manifests), err)
	}

	// A registry with the referrers API lists the first run's bundles too:
	// each statement still counts once.
	var first ocispec.Index
	json.Unmarshal(firstIndex, &first)
	both := index
	both.Manifests = append(append([]ocispec.Descriptor{}, index.Manifests...), first.Manifests...)
	union, _ := json.Marshal(both)
	reg.PutManifest(t, "antrea/antrea-agent", fallbackTag(signed.Digest), ocispec.MediaTypeImageIndex, union)
	if sts, err := verifier.VerifyAttestations(ctx, resolver, repo, signed.Digest); err != nil || len(sts) != 2 {
		t.Errorf("with both runs' bundles listed, kiln read %d attestations (%v), want 2", len(sts), err)
	}

	// A bundle anyone can add does not hide a valid signature in the tags.
	legacy := image("v0")
	sigLayer, _ := signer.SignatureLayer(repo, legacy.Digest)
	if _, err := Attach(ctx, resolver, repo, legacy.Digest, "sig", []Layer{sigLayer}); err != nil {
		t.Fatal(err)
	}
	release(attacker, legacy, legacy.Digest)
	if err := verifier.VerifyImage(ctx, resolver, repo, legacy.Digest); err != nil {
		t.Errorf("a foreign bundle hid the .sig tag's signature: %v", err)
	}

	// An attacker's bundles: another key's, and the right key's naming
	// another image.
	forged := image("v2")
	release(attacker, forged, forged.Digest)
	replayed := image("v3")
	release(signer, replayed, signed.Digest)
	for name, d := range map[string]digest.Digest{"another key's": forged.Digest, "another image's": replayed.Digest} {
		ref := repo + "@" + d.String()
		if out, err := cosign("verify", "--key", pub, ref); err == nil {
			t.Errorf("cosign verify passed %s bundle:\n%s", name, out)
		}
		if err := verifier.VerifyImage(ctx, resolver, repo, d); err == nil || !strings.Contains(err.Error(), "no signature among the 3 bundles") {
			t.Errorf("kiln's verifier of %s bundle: %v", name, err)
		}
		if _, err := verifier.VerifyAttestations(ctx, resolver, repo, d); err == nil {
			t.Errorf("kiln's verifier took the attestations of %s bundle", name)
		}
	}
}
