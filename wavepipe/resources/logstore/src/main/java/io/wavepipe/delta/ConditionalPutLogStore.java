package io.wavepipe.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log on an object store whose writes can be conditional (S3 and S3-compatible stores
 * through S3A with {@code fs.s3a.create.conditional.enabled}).
 *
 * <p>A new log entry is one PUT with {@code If-None-Match: *}: of two writers of the same version
 * the store accepts exactly one, whatever process or client each is (another Spark driver,
 * delta-rs with conditional puts). Delta's own S3 LogStore checks for the entry and then writes
 * it, which a second writer can overwrite in between; its lock is held in one JVM only.
 *
 * <p>A PUT whose answer is lost (a dropped connection after the store took it) is settled by
 * reading the entry back: the bytes this writer sent mean it won, others mean it lost.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {
  /** The S3A option that makes a create an {@code If-None-Match: *} PUT. */
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

  public ConditionalPutLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    byte[] entry = encode(actions);
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(entry);
      }
      return;
    }
    try {
      FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
      try {
        out.write(entry);
      } finally {
        out.close();
      }
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      throw new FileAlreadyExistsException(path.toString());
    } catch (IOException e) {
      settle(fs, path, entry, e);
    }
  }

  /** After a failed conditional PUT: did this writer's entry land, another's, or none? */
  private static void settle(FileSystem fs, Path path, byte[] entry, IOException failure) throws IOException {
    byte[] found;
    try (InputStream in = fs.open(path)) {
      found = in.readAllBytes();
    } catch (FileNotFoundException absent) {
      throw failure;
    }
    if (!Arrays.equals(found, entry)) {
      FileAlreadyExistsException lost = new FileAlreadyExistsException(path.toString());
      lost.initCause(failure);
      throw lost;
    }
  }

  private static byte[] encode(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}
