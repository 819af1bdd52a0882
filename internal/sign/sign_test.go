package sign

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/testdaemon"
)

func TestBlobSignaturesInteroperateWithCosign(t *testing.T) {
	keys := testdaemon.CosignKeyPair(t, "s3cret-pass")
	other := testdaemon.CosignKeyPair(t, "other")
	signer, err := LoadKey(filepath.Join(keys, "cosign.key"), []byte("s3cret-pass"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "SHA256SUMS")
	data := []byte("0123  antctl-linux-x86_64\n")
	os.WriteFile(file, data, 0o644)
	sig, err := signer.Sign(data)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file+".sig", []byte(sig+"\n"), 0o644)
	verifyBlob := func(pub string) (string, error) {
		out, err := exec.Command(testdaemon.Cosign(t), "verify-blob", "--key", pub, "--signature", file+".sig", "--insecure-ignore-tlog", file).CombinedOutput()
		return string(out), err
	}
	if out, err := verifyBlob(filepath.Join(keys, "cosign.pub")); err != nil {
		t.Errorf("cosign verify-blob with the right key: %v\n%s", err, out)
	}
	if out, err := verifyBlob(filepath.Join(other, "cosign.pub")); err == nil {
		t.Errorf("cosign verify-blob passed with another key:\n%s", out)
	}
	os.WriteFile(file, append(data, 'x'), 0o644)
	if out, err := verifyBlob(filepath.Join(keys, "cosign.pub")); err == nil {
		t.Errorf("cosign verify-blob passed for a changed file:\n%s", out)
	}

	// And kiln verifies what cosign signs: a bare signature, which cosign v3
	// writes only without its bundle format and signing config.
	cmd := exec.Command(testdaemon.Cosign(t), "sign-blob", "--key", filepath.Join(keys, "cosign.key"), "--new-bundle-format=false", "--use-signing-config=false", "--tlog-upload=false", "--yes", file)
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=s3cret-pass")
	cosignSig, err := cmd.Output()
	if err != nil {
		t.Fatalf("cosign sign-blob: %v", err)
	}
	pub, err := LoadPublicKey(filepath.Join(keys, "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Verify(append(data, 'x'), string(cosignSig)); err != nil {
		t.Errorf("kiln does not verify cosign's signature: %v", err)
	}
	if err := pub.Verify(data, string(cosignSig)); err == nil {
		t.Error("kiln verified cosign's signature over other data")
	}
}

func TestEnvelopesVerifyOnlyWithTheirKey(t *testing.T) {
	priv, _, err := GenerateKeyPair([]byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	_, otherPub, _ := GenerateKeyPair([]byte("pw"))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "k"), priv, 0o600)
	os.WriteFile(filepath.Join(dir, "other.pub"), otherPub, 0o644)
	s, err := LoadKey(filepath.Join(dir, "k"), []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Envelope([]byte(`{"_type":"https://in-toto.io/Statement/v1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.Verifier().OpenEnvelope(env); err != nil || !strings.Contains(string(st), "Statement/v1") {
		t.Errorf("own envelope: %q, %v", st, err)
	}
	other, _ := LoadPublicKey(filepath.Join(dir, "other.pub"))
	if _, err := other.OpenEnvelope(env); err == nil {
		t.Error("an envelope verified with another key")
	}
	tampered := strings.Replace(string(env), `"payload":"ey`, `"payload":"eX`, 1)
	if _, err := s.Verifier().OpenEnvelope([]byte(tampered)); err == nil {
		t.Error("a tampered envelope verified")
	}
}

func TestBadKeysGetOneClearError(t *testing.T) {
	dir := t.TempDir()
	priv, pub, _ := GenerateKeyPair([]byte("right-password"))
	os.WriteFile(filepath.Join(dir, "cosign.key"), priv, 0o600)
	os.WriteFile(filepath.Join(dir, "cosign.pub"), pub, 0o644)
	for _, tt := range []struct {
		name, path, password string
		wants                []string
	}{
		{"missing", filepath.Join(dir, "absent.key"), "x", []string{"absent.key", "cosign generate-key-pair", KeyEnv}},
		{"wrong password", filepath.Join(dir, "cosign.key"), "wrong-password-value", []string{"cosign.key", "wrong password", PasswordEnv}},
		{"public key given", filepath.Join(dir, "cosign.pub"), "x", []string{"cosign.pub", "PUBLIC KEY", "ENCRYPTED SIGSTORE PRIVATE KEY"}},
		{"unset variable", "env://KILN_TEST_UNSET_KEY", "x", []string{"env://KILN_TEST_UNSET_KEY", "KILN_TEST_UNSET_KEY is not set or empty"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadKey(tt.path, []byte(tt.password))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), tt.password) && tt.password != "x" {
				t.Errorf("%q echoes the password", err)
			}
		})
	}
}

// Keys from env://VAR, as cosign's --key env://VAR: a CI secret need not
// be written to a file.
func TestKeysFromTheEnvironment(t *testing.T) {
	priv, pub, _ := GenerateKeyPair([]byte("pw"))
	t.Setenv("KILN_TEST_SIGNING_KEY", string(priv))
	t.Setenv("KILN_TEST_PUBLIC_KEY", string(pub))
	s, err := LoadKey("env://KILN_TEST_SIGNING_KEY", []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.Sign([]byte("SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadPublicKey("env://KILN_TEST_PUBLIC_KEY")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify([]byte("SHA256SUMS"), sig); err != nil {
		t.Error(err)
	}
	t.Setenv("KILN_TEST_PUBLIC_KEY", "   ")
	if _, err := LoadPublicKey("env://KILN_TEST_PUBLIC_KEY"); err == nil || !strings.Contains(err.Error(), "KILN_TEST_PUBLIC_KEY is not set or empty") {
		t.Errorf("an empty variable: %v", err)
	}
}
