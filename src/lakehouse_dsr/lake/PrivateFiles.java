// Writes each row's text to a file of its own, owner-only, from inside Spark's generated code, for
// lakehouse-dsr (privatefiles.py): the access export's JSON packages are written where Spark holds
// them, in the JVM, with no Python worker to start and no rows to pickle. Spark's stock Invoke calls
// `apply` through java.util.function.BiFunction, so generated code names no class of ours; the
// literal's text is "private files", so no path reaches a plan string. Compiled by Janino
// (bridge.py): raw types throughout, no lambdas.
package lakehouse_dsr;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileAttribute;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.EnumSet;
import java.util.Set;
import java.util.function.BiFunction;
import org.apache.spark.unsafe.types.UTF8String;

public class PrivateFiles implements BiFunction, java.io.Serializable {
  private static final char[] HEX = "0123456789abcdef".toCharArray();
  private final String directory;
  private final long killPid;

  public PrivateFiles() { this(null, 0L); }

  private PrivateFiles(String directory, long killPid) {
    this.directory = directory;
    this.killPid = killPid;
  }

  /** Replaces file `name` (a UTF8String) of the directory atomically with `text` (a UTF8String, as
   *  UTF-8), mode 0600 from its creation; returns the bytes' SHA-256 in hex (a UTF8String). */
  public Object apply(Object name, Object text) {
    byte[] data = ((UTF8String) text).getBytes();
    Path folder = Paths.get(directory);
    Path target = folder.resolve(name.toString());
    Path tmp = folder.resolve(name.toString() + ".tmp");
    Set owner = PosixFilePermissions.fromString("rw-------");
    try {
      FileChannel channel = FileChannel.open(tmp,
          EnumSet.of(StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING),
          new FileAttribute[] {PosixFilePermissions.asFileAttribute(owner)});
      try {
        Files.setPosixFilePermissions(tmp, owner);  // an older temp file keeps its mode through CREATE
        ByteBuffer buffer = ByteBuffer.wrap(data);
        while (buffer.hasRemaining()) {
          channel.write(buffer);
        }
      } finally {
        channel.close();
      }
      // Not synced (1 ms a file): the caller checks every file right after, before it records anything.
      Files.move(tmp, target, new java.nio.file.CopyOption[] {StandardCopyOption.REPLACE_EXISTING,
          StandardCopyOption.ATOMIC_MOVE});
    } catch (IOException e) {
      throw new UncheckedIOException("could not write " + target, e);
    }
    if (killPid > 0) {  // the failpoint: the driver dies mid-export, a file written (no ProcessHandle in Janino)
      try {
        Runtime.getRuntime().exec(new String[] {"kill", "-KILL", Long.toString(killPid)}).waitFor();
      } catch (Exception e) {
        throw new IllegalStateException("the failpoint could not kill " + killPid, e);
      }
    }
    return UTF8String.fromString(sha256(data));
  }

  private static String sha256(byte[] data) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(data);
      char[] out = new char[digest.length * 2];
      for (int i = 0; i < digest.length; i++) {
        out[2 * i] = HEX[(digest[i] >> 4) & 15];
        out[2 * i + 1] = HEX[digest[i] & 15];
      }
      return new String(out);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  public String toString() { return "private files"; }

  /** The object whose `apply` writes a file to `directory` (see apply): `killPid` > 0 kills that
   *  process after each write (the export's failpoint). */
  public BiFunction writer(String directory, long killPid) { return new PrivateFiles(directory, killPid); }
}
