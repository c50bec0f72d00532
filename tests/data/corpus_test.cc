#include "atoll/data/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

using testing::TempDir;
using testing::write_file;

// The DataError message `f` throws ("" if none).
template <typename F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Corpus, FilesAndFoldersInSortedOrder) {
  TempDir dir;
  write_file(dir / "in/b.txt", "bee\n");
  write_file(dir / "in/a/z.txt", "zed\n");
  write_file(dir / "in/a/c.txt", "sea\n");
  write_file(dir / "in/.hidden", "secret\n");
  write_file(dir / "in/.git/config", "ignored\n");
  write_file(dir / "in/quotes", "one\n%\ntwo\nlines\n%\n%\nthree\n");
  write_file(dir / "in/quotes.dat", std::string("\0\0\0\x02", 4));  // strfile index: skipped
  std::filesystem::create_symlink("quotes", dir / "in/quotes.u8");  // Debian's duplicate names
  write_file(dir / "single.txt", "alone\n");

  const auto files = list_corpus_files({dir / "in", dir / "single.txt"});
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files[0], dir / "in/a/c.txt");
  EXPECT_EQ(files[1], dir / "in/a/z.txt");
  EXPECT_EQ(files[2], dir / "in/b.txt");
  EXPECT_EQ(files[3], dir / "in/quotes");
  EXPECT_EQ(files[4], dir / "single.txt");

  const Corpus c = read_corpus({dir / "in", dir / "single.txt"});
  EXPECT_EQ(c.docs, (std::vector<std::string>{"sea\n", "zed\n", "bee\n", "one", "two\nlines", "three", "alone\n"}));
  EXPECT_EQ(c.files, files);
  EXPECT_EQ(c.bytes, 4 + 4 + 4 + 26 + 6);  // quotes read once
}

TEST(Corpus, FingerprintFollowsContentNotPath) {
  TempDir dir;
  write_file(dir / "a/x.txt", "hello\n");
  write_file(dir / "b/y.txt", "hello\n");
  const uint64_t a = read_corpus({dir / "a"}).fingerprint;
  EXPECT_EQ(a, read_corpus({dir / "b/y.txt"}).fingerprint);
  write_file(dir / "b/y.txt", "hello!\n");
  EXPECT_NE(a, read_corpus({dir / "b"}).fingerprint);
}

TEST(Corpus, Jsonl) {
  TempDir dir;
  write_file(dir / "d.jsonl",
             "{\"text\": \"first\\nline\", \"id\": 1}\n\n{\"text\": \"caf\\u00e9\"}\n{\"text\": \"  \"}\n");
  EXPECT_EQ(read_documents(dir / "d.jsonl"), (std::vector<std::string>{"first\nline", "café"}));
}

// The format follows the extension whatever its case: `.JSONL` and `.Jsonl` are JSONL too,
// not one plain-text document holding the JSON lines.
TEST(Corpus, JsonlExtensionInAnyCase) {
  TempDir dir;
  for (const char* name : {"upper.JSONL", "mixed.Jsonl"}) {
    write_file(dir / name, "{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
    EXPECT_EQ(read_documents(dir / name), (std::vector<std::string>{"one", "two"})) << name;
  }
  write_file(dir / "bad.JsonL", "{\"body\": \"no text\"}\n");
  EXPECT_TRUE(contains(data_error([&] { read_documents(dir / "bad.JsonL"); }), dir / "bad.JsonL:1"));
}

TEST(Corpus, BadJsonlLineIsNamed) {
  TempDir dir;
  write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": oops}\n");
  std::string msg = data_error([&] { read_documents(dir / "bad.jsonl"); });
  EXPECT_TRUE(contains(msg, dir / "bad.jsonl:3")) << msg;
  EXPECT_TRUE(contains(msg, "not valid JSON")) << msg;

  write_file(dir / "field.jsonl", "{\"body\": \"no text field\"}\n");
  msg = data_error([&] { read_documents(dir / "field.jsonl"); });
  EXPECT_TRUE(contains(msg, dir / "field.jsonl:1")) << msg;
  EXPECT_TRUE(contains(msg, "\"text\"")) << msg;
}

TEST(Corpus, BinaryFileIsRefused) {
  TempDir dir;
  write_file(dir / "nul.txt", std::string("text\0more", 9));
  std::string msg = data_error([&] { read_corpus({dir / "nul.txt"}); });
  EXPECT_TRUE(contains(msg, dir / "nul.txt")) << msg;
  EXPECT_TRUE(contains(msg, "NUL byte at byte 4")) << msg;

  write_file(dir / "latin1.txt", "caf\xE9 au lait\n");
  msg = data_error([&] { read_corpus({dir / "latin1.txt"}); });
  EXPECT_TRUE(contains(msg, "invalid UTF-8")) << msg;
  EXPECT_TRUE(contains(msg, "iconv")) << msg;
}

TEST(Corpus, LateInvalidBytesAreReplaced) {
  TempDir dir;
  // Past the first KiB a stray byte is no longer a sign of a binary file.
  write_file(dir / "late.txt", std::string(2000, 'a') + "\xFF" + "b");
  const auto docs = read_documents(dir / "late.txt");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0], std::string(2000, 'a') + "\xEF\xBF\xBD" + "b");
  // A multi-byte character cut by the 1 KiB boundary is fine.
  write_file(dir / "cut.txt", std::string(1023, 'a') + "\xC3\xA9");
  EXPECT_EQ(read_documents(dir / "cut.txt")[0], std::string(1023, 'a') + "é");
}

TEST(Corpus, EmptyInputIsRefused) {
  TempDir dir;
  write_file(dir / "e/empty.txt", "");
  write_file(dir / "e/blank.txt", "  \n\n");
  std::string msg = data_error([&] { read_corpus({dir / "e"}); });
  EXPECT_TRUE(contains(msg, "no text found")) << msg;
  EXPECT_TRUE(contains(msg, dir / "e")) << msg;
  std::filesystem::create_directories(dir / "none");
  EXPECT_TRUE(contains(data_error([&] { read_corpus({dir / "none"}); }), "no text found"));
}

TEST(Corpus, MissingPathIsRefused) {
  TempDir dir;
  std::string msg;
  try {
    read_corpus({dir / "nope"});
  } catch (const PathError& e) {  // core/user_path.h: every user path is checked before it is read
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, dir / "nope")) << msg;
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;
}

TEST(Corpus, DefaultCorpusHasText) {
  const auto paths = default_corpus_paths();
  ASSERT_FALSE(paths.empty());
  if (!std::filesystem::exists(paths[0])) GTEST_SKIP() << paths[0] << " absent (apt-get install fortunes)";
  const Corpus c = read_corpus(paths);
  EXPECT_GT(c.docs.size(), 1000u);
  EXPECT_GT(c.bytes, 100000);
}

}  // namespace
}  // namespace atl
